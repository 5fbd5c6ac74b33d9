"""Decode one subtask's stored entries (key order, as a store scan yields them) into
Arrow tables of the operator's state schema (`sparkpoint.state.descriptor`). Pure:
no Spark, no RocksDB; the caller brings the entries.

Tables come out in batches of about `batch_rows` rows. Stored keys sort by key group
first, and a key's states (one namespace each) all sit in its key group, so a
processor's row is complete once the scan leaves the key group: batches are cut only
there.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.state import pane_tables, session_tables, ttl, window_tables
from sparkpoint.state.codec import FixedWidthCodec, RowCodec
from sparkpoint.errors import StateSchemaError
from sparkpoint.state.descriptor import SIDES, OperatorStateSchema, StateVariable
from sparkpoint.state.key_decode import decode_user_key, split_key, split_namespace
from sparkpoint.state.keys import decode_timestamp, encode_user_keys, key_columns_from_plain

# Namespaces and record layouts of the built-in operators (sparkpoint.api.aggregate,
# sparkpoint.api.window, sparkpoint.api.windows.state, sparkpoint.api.join,
# sparkpoint.api.dedup, sparkpoint.api.topn, sparkpoint.api.processor).
_AGG_NS = "agg"
# A tumbling window: one Arrow table per key group (window_tables.py); stores of the
# per-window layout: one record per window and its fire / clean-up index entries.
_TABLE_NS, _WINDOW_NS, _FIRE_NS, _CLEANUP_NS = (window_tables.TABLE_NS, window_tables.OLD_RECORD_NS,
                                                window_tables.OLD_FIRE_NS, window_tables.OLD_CLEANUP_NS)
_TIMERS_NS = "~timers"
_DUE = "-due"  # a sliding, session or cumulate window's due index: <ns>-due
_JOIN_NS = {"interval": "ijoin", "window": "wjoin", "stream": "sjoin"}  # rows: <ns>-left, <ns>-right
_ROW_ID_LEN = 12  # a join row's id: <epoch: 8><position: 4>
_MATCHED = 1  # an interval-join row's last value byte: it met a partner
_DEDUP_NS = "dedup"  # <user key> -> the time the key is released (its index by time: dedup-release)
_TOPN_NS = "topn"  # <user key> -> the key's top rows, in rank order, one Arrow IPC record-batch message

Entries = Iterable[tuple[bytes, bytes]]
_SQL_AGG_NS = "agg-sql"  # a KeyedAggregate's Spark SQL partials: <user key> -> one msgpack list
_PARTS = "-parts"  # a window's Spark SQL partials beside its records: <ns>-parts


class SqlPartials(Protocol):
    """Turns a step's stored Spark SQL partials into its aggregates' values (the
    aggregates are the pipeline builder's: sparkpoint.api.state_schema.sql_partials)."""

    def decode(self, raw: list[bytes]) -> pa.Table: ...

    def results(self, parts: pa.Table) -> list[pa.Array]: ...


def read_state(entries: Entries, desc: OperatorStateSchema, batch_rows: int = 4096,
               partials: SqlPartials | None = None) -> Iterator[pa.Table]:
    """`partials`: needed for a step with Spark SQL aggregates."""
    if desc.sql_aggs:
        if partials is None:
            raise StateSchemaError(f"step {desc.operator!r} keeps Spark SQL aggregate partials; read it with the "
                                   "reader of its aggregates")
        if desc.type == "aggregate":
            return _read_sql_aggregate(entries, desc, partials, batch_rows)
        return _read_sql_windows(entries, desc, partials, batch_rows)
    if desc.type == "aggregate":
        return _read_records(entries, desc, _AGG_NS, batch_rows)
    if desc.is_pane_window:
        return _read_pane_windows(entries, desc, batch_rows)
    if desc.type == "window":
        return _read_tumbling_windows(entries, desc, batch_rows)
    if desc.type == "join":
        return _read_join(entries, desc, batch_rows)
    if desc.type == "dedup":
        return _read_dedup(entries, desc, batch_rows)
    if desc.type == "topn":
        return _read_topn(entries, desc, batch_rows)
    return _read_processor(entries, desc, batch_rows)


def read_timers(entries: Entries, desc: OperatorStateSchema, batch_rows: int = 4096) -> Iterator[pa.Table]:
    schema = desc.timer_schema()
    if desc.is_pane_window:
        yield from _read_pane_window_timers(entries, desc, schema, batch_rows)
        return
    types = [f.type for f in desc.key_fields()]
    wanted = {_TIMERS_NS} if desc.type == "processor" else {_FIRE_NS, _CLEANUP_NS}
    rows: list[tuple[tuple, int, str]] = []
    for key, value in entries:
        g, ns, at = split_namespace(key)
        if ns == _TABLE_NS and desc.type == "window":
            if rows:
                yield _timer_table(rows, desc, schema)
                rows = []
            yield from _window_table_timers(window_tables.decode(value, _where(desc, g)), desc, schema)
            continue
        if ns not in wanted:
            continue
        ts = decode_timestamp(key[at:at + 8])
        values, _ = decode_user_key(key, at + 8, types)
        rows.append((values, ts, ns))
        if len(rows) >= batch_rows:
            yield _timer_table(rows, desc, schema)
            rows = []
    if rows:
        yield _timer_table(rows, desc, schema)


# -- built-in operators: one fixed-width record per key (and window) ------------------
def _record_codec(desc: OperatorStateSchema) -> FixedWidthCodec:
    kind = "f8" if desc.value_type == "double" else "i8"
    if desc.type == "aggregate":
        return FixedWidthCodec(desc.operator, [("count", "i8"), ("nvalues", "i8"), ("sum", kind),
                                               ("min", kind), ("max", kind)])
    return FixedWidthCodec(desc.operator, [("count", "i8"), ("sum", kind), ("fired", "i8")])


def _read_records(entries: Entries, desc: OperatorStateSchema, ns: str, batch_rows: int) -> Iterator[pa.Table]:
    schema = desc.output_schema()
    types = [f.type for f in desc.key_fields()]
    codec = _record_codec(desc)
    keys: list[tuple] = []
    suffixes: list[bytes] = []
    values: list[bytes] = []
    for key, value in entries:
        if split_namespace(key)[1] != ns:
            continue
        sk = split_key(key, types)
        keys.append(sk.values)
        suffixes.append(sk.suffix)
        values.append(value)
        if len(keys) >= batch_rows:
            yield _record_table(desc, schema, codec, keys, suffixes, values)
            keys, suffixes, values = [], [], []
    if keys:
        yield _record_table(desc, schema, codec, keys, suffixes, values)


def _record_table(desc: OperatorStateSchema, schema: pa.Schema, codec: FixedWidthCodec, keys: list[tuple],
                  suffixes: list[bytes], values: list[bytes]) -> pa.Table:
    rec = codec.decode_many(values)
    cols: dict[str, pa.Array] = dict(zip(desc.key_columns, key_columns_from_plain(keys, desc.key_fields())))
    vt = desc.arrow_value_type
    if desc.type == "aggregate":
        no_values = rec["nvalues"] == 0  # SQL semantics: sum/min/max of only nulls is null
        for a in desc.aggs:
            cols[a] = (pa.array(rec["count"], pa.int64()) if a == "count"
                       else pa.array(rec[a], type=vt, mask=no_values))
    else:
        starts = np.array([decode_timestamp(s) for s in suffixes], dtype=np.int64)
        cols["window_start"] = pa.array(starts)
        cols["window_end"] = pa.array(starts + desc.size_ms)
        cols["count"] = pa.array(rec["count"], pa.int64())
        if "sum" in desc.aggs:
            cols["sum"] = pa.array(rec["sum"], type=vt)
        cols["fired"] = pa.array(rec["fired"] == 1)
    return pa.table([cols[f.name] for f in schema], schema=schema)


# -- tumbling windows: one Arrow table per key group ------------------------------------
def _read_tumbling_windows(entries: Entries, desc: OperatorStateSchema, batch_rows: int) -> Iterator[pa.Table]:
    """A key group's table, in the order the per-window layout's records came in (encoded
    user key, then window start); stores of that layout through `_read_records`."""
    old: list[tuple[bytes, bytes]] = []
    for key, value in entries:
        g, ns, _ = split_namespace(key)
        if ns == _WINDOW_NS:
            old.append((key, value))
        elif ns == _TABLE_NS:
            if old:
                yield from _read_records(old, desc, _WINDOW_NS, batch_rows)
                old = []
            yield _window_table_rows(window_tables.decode(value, _where(desc, g)), desc)
    if old:
        yield from _read_records(old, desc, _WINDOW_NS, batch_rows)


def _where(desc: OperatorStateSchema, group: int) -> str:
    return f"window step {desc.operator!r}, key group {group}"


def _in_key_order(table: pa.Table, desc: OperatorStateSchema, time_column: str = "window_start",
                  time_first: bool = False) -> pa.Table:
    """`table` in the order of the per-window layout's keys: <user key><time> (records)
    or <time><user key> (index entries)."""
    keys = table.select(list(desc.key_columns)).cast(pa.schema(desc.key_fields()))
    order = pa.table({"k": pa.array(encode_user_keys(keys, list(desc.key_columns)), pa.binary()),
                      "t": table.column(time_column)})
    by = [("t", "ascending"), ("k", "ascending")] if time_first else [("k", "ascending"), ("t", "ascending")]
    return table.take(pc.sort_indices(order, by))


def _window_table_rows(table: pa.Table, desc: OperatorStateSchema) -> pa.Table:
    schema = desc.output_schema()
    table = _in_key_order(table, desc)
    starts = table.column("window_start").cast(pa.int64())
    cols: dict[str, Any] = {f.name: table.column(f.name).cast(f.type) for f in desc.key_fields()}
    cols["window_start"] = starts
    cols["window_end"] = pc.add(starts, desc.size_ms)
    cols["count"] = table.column("count").cast(pa.int64())
    if "sum" in desc.aggs:
        cols["sum"] = table.column("sum").cast(desc.arrow_value_type)
    cols["fired"] = table.column("fired")
    return pa.table([cols[f.name] for f in schema], schema=schema)


def _window_table_timers(table: pa.Table, desc: OperatorStateSchema, schema: pa.Schema) -> Iterator[pa.Table]:
    """What the per-window layout's indexes held: a 'fire' timer at its end for each
    window not fired yet, and with allowed lateness a 'cleanup' timer at end + lateness
    for each window, each kind in time order (the indexes' key order)."""
    starts = table.column("window_start").to_numpy()
    fired = table.column("fired").to_numpy(zero_copy_only=False)
    kinds = [("fire", ~fired, desc.size_ms)]
    if desc.allowed_lateness_ms:
        kinds.append(("cleanup", np.ones(len(starts), dtype=bool), desc.size_ms + desc.allowed_lateness_ms))
    for name, which, after in kinds:
        if not which.any():
            continue
        part = table.filter(pa.array(which))
        part = _in_key_order(part.append_column("expiry_ms", pa.array(starts[which] + after)), desc, "expiry_ms",
                             time_first=True)
        expiry = part.column("expiry_ms")
        yield pa.table([*(part.column(f.name).cast(f.type) for f in desc.key_fields()),
                        pc.subtract(expiry, after), pa.array([name] * part.num_rows, pa.string()), expiry],
                       schema=schema)


# -- processors: value / list / map states per key -------------------------------------
def _unwrapper(schema: pa.Schema) -> Callable[[tuple], Any]:
    if len(schema) == 1:
        return lambda row: row[0]
    names = schema.names
    return lambda row: dict(zip(names, row))


class _Decoder:
    def __init__(self, var: StateVariable):
        self.var = var
        self.value = RowCodec(var.name, var.schema)
        self.unwrap_value = _unwrapper(var.schema)
        if var.kind == "map":
            self.key = RowCodec(f"{var.name} (map key)", var.map_key_schema)
            self.unwrap_key = _unwrapper(var.map_key_schema)

    def add(self, row: dict[str, Any], suffix: bytes, raw: bytes) -> None:
        name, kind = self.var.name, self.var.kind
        raw = ttl.unwrap(raw)  # a value written with a TTL carries its expiry first
        if kind == "value":
            row[name] = self.unwrap_value(self.value.decode(raw))
        elif kind == "list":
            if suffix:  # the bare key holds the next sequence number, not an element
                row.setdefault(name, []).append(self.unwrap_value(self.value.decode(raw)))
        else:
            row.setdefault(name, []).append((self.unwrap_key(self.key.decode(suffix)),
                                             self.unwrap_value(self.value.decode(raw))))


def _read_processor(entries: Entries, desc: OperatorStateSchema, batch_rows: int) -> Iterator[pa.Table]:
    schema = desc.output_schema()
    types = [f.type for f in desc.key_fields()]
    decoders = {s.namespace: _Decoder(s) for s in desc.states}
    rows: dict[bytes, tuple[tuple, dict[str, Any]]] = {}
    group = None
    for key, value in entries:
        g, ns, _ = split_namespace(key)
        decoder = decoders.get(ns)
        if decoder is None:
            continue  # timers, or a state the given operator no longer declares
        if g != group and len(rows) >= batch_rows:
            yield _processor_table(rows, desc, schema)
            rows = {}
        group = g
        sk = split_key(key, types)
        _, row = rows.setdefault(sk.user_key, (sk.values, {}))
        decoder.add(row, sk.suffix, value)
    if rows:
        yield _processor_table(rows, desc, schema)


def _processor_table(rows: dict[bytes, tuple[tuple, dict[str, Any]]], desc: OperatorStateSchema,
                     schema: pa.Schema) -> pa.Table:
    ordered = [rows[k] for k in sorted(rows)]
    arrays = key_columns_from_plain([k for k, _ in ordered], desc.key_fields())
    for s in desc.states:
        arrays.append(pa.array([r.get(s.name) for _, r in ordered], type=schema.field(s.name).type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _timer_table(rows: list[tuple[tuple, int, str]], desc: OperatorStateSchema, schema: pa.Schema) -> pa.Table:
    arrays = key_columns_from_plain([k for k, _, _ in rows], desc.key_fields())
    expiry = np.array([ts for _, ts, _ in rows], dtype=np.int64)
    if desc.type == "window":
        fire = np.array([ns == _FIRE_NS for _, _, ns in rows], dtype=bool)
        # fire index: at window_end; clean-up index: at window_end + allowed lateness
        starts = expiry - desc.size_ms - np.where(fire, 0, desc.allowed_lateness_ms)
        arrays += [pa.array(starts), pa.array(np.where(fire, "fire", "cleanup").tolist(), pa.string())]
    arrays.append(pa.array(expiry))
    return pa.Table.from_arrays(arrays, schema=schema)


# -- Spark SQL aggregates: partials per key, or per key and window beside its record ---
def _read_sql_aggregate(entries: Entries, desc: OperatorStateSchema, partials: SqlPartials,
                        batch_rows: int) -> Iterator[pa.Table]:
    schema = desc.output_schema()
    types = [f.type for f in desc.key_fields()]
    keys: list[tuple] = []
    values: list[bytes] = []
    for key, value in entries:
        if split_namespace(key)[1] != _SQL_AGG_NS:
            continue
        keys.append(split_key(key, types).values)
        values.append(value)
        if len(keys) >= batch_rows:
            yield _sql_aggregate_table(desc, schema, partials, keys, values)
            keys, values = [], []
    if keys:
        yield _sql_aggregate_table(desc, schema, partials, keys, values)


def _sql_aggregate_table(desc: OperatorStateSchema, schema: pa.Schema, partials: SqlPartials, keys: list[tuple],
                         values: list[bytes]) -> pa.Table:
    columns = [*key_columns_from_plain(keys, desc.key_fields()), *partials.results(partials.decode(values))]
    return pa.Table.from_arrays(columns, schema=schema)


def _read_sql_windows(entries: Entries, desc: OperatorStateSchema, partials: SqlPartials,
                      batch_rows: int) -> Iterator[pa.Table]:
    """A window's record (bounds, flags) and its partials share `<user key><suffix>` in
    two namespaces of one key group, so they are paired per key group."""
    schema = desc.output_schema()
    types = [f.type for f in desc.key_fields()]
    codec = _pane_codec(desc)
    parts_ns = desc.namespace + _PARTS
    records: dict[bytes, tuple[tuple, bytes]] = {}
    parts: dict[bytes, bytes] = {}
    group = None
    done: list[tuple[tuple, bytes, bytes]] = []
    for key, value in entries:
        g, ns, at = split_namespace(key)
        if g != group:
            done += _paired(records, parts, desc, group)
            records, parts, group = {}, {}, g
            if len(done) >= batch_rows:
                yield _sql_window_table(desc, schema, codec, partials, done)
                done = []
        if ns == desc.namespace:
            records[key[at:]] = (split_key(key, types).values, value)
        elif ns == parts_ns:
            parts[key[at:]] = value
    done += _paired(records, parts, desc, group)
    if done:
        yield _sql_window_table(desc, schema, codec, partials, done)


def _paired(records: dict[bytes, tuple[tuple, bytes]], parts: dict[bytes, bytes], desc: OperatorStateSchema,
            group: int | None) -> list[tuple[tuple, bytes, bytes]]:
    missing = [k for k in records if k not in parts]
    if missing or len(parts) != len(records):
        raise StateSchemaError(f"window step {desc.operator!r}: key group {group} holds {len(records)} window "
                               f"records and {len(parts)} aggregate partials, not one of each per window; its state "
                               "is not one this step wrote")
    return [(values, record, parts[k]) for k, (values, record) in records.items()]


def _sql_window_table(desc: OperatorStateSchema, schema: pa.Schema, codec: FixedWidthCodec, partials: SqlPartials,
                      windows: list[tuple[tuple, bytes, bytes]]) -> pa.Table:
    rec = codec.decode_many([w[1] for w in windows])
    columns = [*key_columns_from_plain([w[0] for w in windows], desc.key_fields()),
               pa.array(rec["start"], pa.int64()), pa.array(rec["end"], pa.int64()),
               *partials.results(partials.decode([w[2] for w in windows])),
               pa.array(rec["fired"] != 0), pa.array(rec["late"] != 0)]
    return pa.Table.from_arrays(columns, schema=schema)


# -- sliding, session and cumulate windows: one record per key and window ---------------
def _pane_codec(desc: OperatorStateSchema) -> FixedWidthCodec:
    if desc.sql_aggs:  # the partials sit beside the record; it keeps the row count
        return FixedWidthCodec(desc.operator, [("start", "i8"), ("end", "i8"), ("count", "i8"), ("fired", "i8"),
                                               ("late", "i8")])
    kind = "f8" if desc.value_type == "double" else "i8"
    return FixedWidthCodec(desc.operator, [("start", "i8"), ("end", "i8"), ("count", "i8"), ("nvalues", "i8"),
                                           ("sum", kind), ("min", kind), ("max", kind), ("fired", "i8"),
                                           ("late", "i8")])


def _read_pane_windows(entries: Entries, desc: OperatorStateSchema, batch_rows: int) -> Iterator[pa.Table]:
    schema = desc.output_schema()
    types = [f.type for f in desc.key_fields()]
    codec = _pane_codec(desc)
    keys: list[tuple] = []
    values: list[bytes] = []
    for key, value in entries:
        g, ns, _ = split_namespace(key)
        if pane_tables.holds_panes(ns, desc.window_kind):
            yield _pane_table_windows(*pane_tables.decode(value, _where(desc, g)), desc)
            continue
        if ns == session_tables.SESSION_NS and desc.window_kind == "session":
            yield _session_table_rows(session_tables.decode(value, _where(desc, g)), desc)
            continue
        if ns != desc.namespace:
            continue
        keys.append(split_key(key, types).values)
        values.append(value)
        if len(keys) >= batch_rows:
            yield _pane_table(desc, schema, codec, keys, values)
            keys, values = [], []
    if keys:
        yield _pane_table(desc, schema, codec, keys, values)


def _pane_table_windows(table: pa.Table, fired_through: int, desc: OperatorStateSchema) -> pa.Table:
    """A sliding or cumulate window's group table (pane_tables.py) as the windows it
    holds. `late` is not kept in that layout (it is decided as each window is emitted):
    False."""
    held = _in_key_order(pane_tables.windows_held(table, fired_through), desc, "window_end")
    n = held.num_rows
    rec = {c: held.column(c).to_numpy() for c in ("count", "nvalues", "sum", "min", "max") if c in held.column_names}
    rec.setdefault("nvalues", np.zeros(n, np.int64))
    cols = {k: held.column(k).cast(f.type) for k, f in zip(desc.key_columns, desc.key_fields())}
    cols["window_start"] = held.column("window_start")
    cols["window_end"] = held.column("window_end")
    cols.update(_pane_aggs(desc, rec))
    cols["fired"] = held.column("fired")
    cols["late"] = pa.array(np.zeros(n, dtype=bool))
    schema = desc.output_schema()
    return pa.table([cols[f.name] for f in schema], schema=schema)


def _session_table_rows(table: pa.Table, desc: OperatorStateSchema) -> pa.Table:
    """A session window's group table (session_tables.py): one row per open session,
    as the per-session layout held it."""
    held = _in_key_order(table, desc, session_tables.START)
    n = held.num_rows
    rec = {c: held.column(c).to_numpy() for c in ("count", "nvalues", "sum", "min", "max") if c in held.column_names}
    rec.setdefault("nvalues", np.zeros(n, np.int64))
    cols = {k: held.column(k).cast(f.type) for k, f in zip(desc.key_columns, desc.key_fields())}
    cols["window_start"] = held.column(session_tables.START)
    cols["window_end"] = held.column(session_tables.END)
    cols.update(_pane_aggs(desc, rec))
    cols["fired"] = held.column(session_tables.FIRED)
    cols["late"] = held.column(session_tables.LATE)
    schema = desc.output_schema()
    return pa.table([cols[f.name] for f in schema], schema=schema)


def _pane_table(desc: OperatorStateSchema, schema: pa.Schema, codec: FixedWidthCodec, keys: list[tuple],
                values: list[bytes]) -> pa.Table:
    rec = codec.decode_many(values)
    no_values = rec["nvalues"] == 0  # SQL semantics: sum/min/max/avg of only nulls is null
    cols: dict[str, pa.Array] = dict(zip(desc.key_columns, key_columns_from_plain(keys, desc.key_fields())))
    cols["window_start"] = pa.array(rec["start"], pa.int64())
    cols["window_end"] = pa.array(rec["end"], pa.int64())
    cols.update(_pane_aggs(desc, rec))
    cols["fired"] = pa.array(rec["fired"] != 0)
    cols["late"] = pa.array(rec["late"] != 0)
    return pa.table([cols[f.name] for f in schema], schema=schema)


def _pane_aggs(desc: OperatorStateSchema, rec: Any) -> dict[str, pa.Array]:
    no_values = rec["nvalues"] == 0  # SQL semantics: sum/min/max/avg of only nulls is null
    cols = {}
    for a in desc.aggs:
        if a == "count":
            cols[a] = pa.array(rec["count"], pa.int64())
        elif a == "avg":
            with np.errstate(invalid="ignore", divide="ignore"):
                cols[a] = pa.array(rec["sum"].astype(np.float64) / rec["nvalues"], pa.float64(), mask=no_values)
        else:
            cols[a] = pa.array(rec[a], type=desc.arrow_value_type, mask=no_values)
    return cols


def _read_pane_window_timers(entries: Entries, desc: OperatorStateSchema, schema: pa.Schema,
                             batch_rows: int) -> Iterator[pa.Table]:
    """Each window's one due entry: 'fire' (final mode, not fired yet: due at its end) or
    'cleanup' (due at end + allowed lateness). A key group's records sort before its due
    entries (the namespace is shorter), so they are looked up per key group."""
    types = [f.type for f in desc.key_fields()]
    codec = _pane_codec(desc)
    due_ns = desc.namespace + _DUE
    held: dict[bytes, tuple[int, int, bool]] = {}  # <user key><suffix> -> (start, end, fired)
    group = None
    rows: list[tuple[tuple, int, int, str, int]] = []
    for key, value in entries:
        g, ns, at = split_namespace(key)
        if g != group:
            held, group = {}, g
        if pane_tables.holds_panes(ns, desc.window_kind):
            rows.extend(_pane_table_timers(*pane_tables.decode(value, _where(desc, g)), desc))
        elif ns == session_tables.SESSION_NS and desc.window_kind == "session":
            rows.extend(_session_table_timers(session_tables.decode(value, _where(desc, g)), desc))
        elif ns == desc.namespace:
            rec = codec.decode_many([value])[0]
            held[key[at:]] = (int(rec["start"]), int(rec["end"]), bool(rec["fired"]))
        elif ns == due_ns:
            due = decode_timestamp(key[at:at + 8])
            values, _ = decode_user_key(key, at + 8, types)
            found = held.get(key[at + 8:])
            if found is None:
                raise StateSchemaError(f"window step {desc.operator!r}: key group {g} has a due entry at {due} "
                                       f"for key {values} without its window record; its state is not one this "
                                       "operator wrote (pass the operator the job declared)")
            start, end, fired = found
            fire = desc.output_mode == "final" and not fired
            rows.append((values, start, end, "fire" if fire else "cleanup", due))
            if len(rows) >= batch_rows:
                yield _pane_timer_table(rows, desc, schema)
                rows = []
    if rows:
        yield _pane_timer_table(rows, desc, schema)


def _pane_table_timers(table: pa.Table, fired_through: int,
                       desc: OperatorStateSchema) -> list[tuple[tuple, int, int, str, int]]:
    """A sliding or cumulate window's group table's windows, each with the due entry the
    per-window layout would hold for it."""
    lateness = pane_tables.shape(table)[2]
    held = _in_key_order(pane_tables.windows_held(table, fired_through), desc, "window_end")
    keys = zip(*[held.column(k).to_pylist() for k in desc.key_columns])
    return [(tuple(k), s, e, "cleanup" if fired or desc.output_mode != "final" else "fire",
             e + lateness if fired or desc.output_mode != "final" else e)
            for k, s, e, fired in zip(keys, held.column("window_start").to_pylist(),
                                      held.column("window_end").to_pylist(), held.column("fired").to_pylist())]


def _session_table_timers(table: pa.Table, desc: OperatorStateSchema) -> list[tuple[tuple, int, int, str, int]]:
    """A session window's group table's sessions, each with the due entry the
    per-session layout would hold for it."""
    lateness = session_tables.shape(table)[0]
    held = _in_key_order(table, desc, session_tables.START)
    keys = zip(*[held.column(k).to_pylist() for k in desc.key_columns])
    out = []
    starts, ends, fired_flags = (held.column(c).to_pylist()
                                 for c in (session_tables.START, session_tables.END, session_tables.FIRED))
    for k, s, e, fired in zip(keys, starts, ends, fired_flags):
        fire = desc.output_mode == "final" and not fired
        out.append((tuple(k), s, e, "fire" if fire else "cleanup", e if fire else e + lateness))
    return out


def _pane_timer_table(rows: list[tuple[tuple, int, int, str, int]], desc: OperatorStateSchema,
                      schema: pa.Schema) -> pa.Table:
    arrays = key_columns_from_plain([r[0] for r in rows], desc.key_fields())
    arrays += [pa.array([r[1] for r in rows], pa.int64()), pa.array([r[2] for r in rows], pa.int64()),
               pa.array([r[3] for r in rows], pa.string()), pa.array([r[4] for r in rows], pa.int64())]
    return pa.Table.from_arrays(arrays, schema=schema)


# -- joins: each side's buffered rows ----------------------------------------------------
def _read_join(entries: Entries, desc: OperatorStateSchema, batch_rows: int) -> Iterator[pa.Table]:
    """One output row per stored row of either side. Keys: <user key>[<time>]<row id>
    (time: the row's event time for an interval join, the window start for a window
    join, absent for a regular join); values: one Arrow IPC record-batch message of the
    row (for an interval join followed by one byte: matched or not)."""
    schema = desc.output_schema()
    types = [f.type for f in desc.key_fields()]
    kind = _JOIN_NS[desc.join_kind]
    sides = {f"{kind}-{name}": i for i, name in enumerate(SIDES)}
    pending: list[list[tuple[tuple, int, bytes]]] = [[], []]
    for key, value in entries:
        side = sides.get(split_namespace(key)[1])
        if side is None:
            continue  # the time index, the window join's firing index
        sk = split_key(key, types)
        at = decode_timestamp(sk.suffix[:8]) if desc.join_kind != "stream" else 0
        pending[side].append((sk.values, at, value))
        if len(pending[side]) >= batch_rows:
            yield _join_table(desc, schema, side, pending[side])
            pending[side] = []
    for side in (0, 1):
        if pending[side]:
            yield _join_table(desc, schema, side, pending[side])


def _join_table(desc: OperatorStateSchema, schema: pa.Schema, side: int,
                found: list[tuple[tuple, int, bytes]]) -> pa.Table:
    n = len(found)
    row_schema = desc.side_schema(side)
    flagged = desc.join_kind == "interval"
    batches = []
    for _, _, value in found:
        buf = pa.py_buffer(value)
        try:
            batches.append(pa.ipc.read_record_batch(buf.slice(0, len(value) - 1) if flagged else buf, row_schema))
        except (pa.ArrowInvalid, OSError) as e:
            raise StateSchemaError(f"join {desc.operator!r}: a stored {SIDES[side]} row cannot be read with the "
                                   f"columns {row_schema.names} ({e})") from None
    rows = pa.Table.from_batches(batches, row_schema).combine_chunks()
    struct = pa.StructArray.from_arrays([rows.column(c).chunk(0) if rows.column(c).num_chunks else
                                         pa.array([], f.type) for c, f in zip(rows.column_names, row_schema)],
                                        fields=list(row_schema))
    cols: dict[str, pa.Array] = dict(zip(desc.key_columns, key_columns_from_plain([k for k, _, _ in found],
                                                                                 desc.key_fields())))
    cols["side"] = pa.array([SIDES[side]] * n, pa.string())
    times = np.array([t for _, t, _ in found], dtype=np.int64)
    if desc.join_kind == "interval":
        cols["time_ms"] = pa.array(times)
        matched = np.array([v[-1] == _MATCHED for _, _, v in found], dtype=bool)
        outer = SIDES[side] in desc.outer
        cols["matched"] = pa.array(matched) if outer else pa.nulls(n, pa.bool_())
    elif desc.join_kind == "window":
        cols["window_start"] = pa.array(times)
        cols["window_end"] = pa.array(times + desc.size_ms)
    other = SIDES[1 - side]
    cols[SIDES[side]] = struct
    cols[other] = pa.nulls(n, schema.field(other).type)
    return pa.table([cols[f.name] for f in schema], schema=schema)


# -- dedup: each held key and the time the watermark releases it ------------------------
def _read_dedup(entries: Entries, desc: OperatorStateSchema, batch_rows: int) -> Iterator[pa.Table]:
    schema = desc.output_schema()
    types = [f.type for f in desc.key_fields()]
    keys: list[tuple] = []
    releases: list[int] = []
    for key, value in entries:
        if split_namespace(key)[1] != _DEDUP_NS:
            continue  # the release index: the same keys again, ordered by time
        keys.append(split_key(key, types).values)
        releases.append(decode_timestamp(value))
        if len(keys) >= batch_rows:
            yield _dedup_table(desc, schema, keys, releases)
            keys, releases = [], []
    if keys:
        yield _dedup_table(desc, schema, keys, releases)


def _dedup_table(desc: OperatorStateSchema, schema: pa.Schema, keys: list[tuple], releases: list[int]) -> pa.Table:
    arrays = key_columns_from_plain(keys, desc.key_fields())
    return pa.Table.from_arrays([*arrays, pa.array(releases, pa.int64())], schema=schema)


# -- top-n: each key's current top rows, ranked -----------------------------------------
def _read_topn(entries: Entries, desc: OperatorStateSchema, batch_rows: int) -> Iterator[pa.Table]:
    schema = desc.output_schema()
    types = [f.type for f in desc.key_fields()]
    rows = desc.top_row_schema()
    found: list[tuple[tuple, pa.RecordBatch]] = []
    n = 0
    for key, value in entries:
        if split_namespace(key)[1] != _TOPN_NS:
            continue
        try:
            batch = pa.ipc.read_record_batch(pa.py_buffer(value), rows)
        except (pa.ArrowInvalid, OSError) as e:
            raise StateSchemaError(f"TopN {desc.operator!r}: a key's stored rows cannot be read with the columns "
                                   f"{rows.names} ({e})") from None
        found.append((split_key(key, types).values, batch))
        n += batch.num_rows
        if n >= batch_rows:
            yield _topn_table(desc, schema, found)
            found, n = [], 0
    if found:
        yield _topn_table(desc, schema, found)


def _topn_table(desc: OperatorStateSchema, schema: pa.Schema, found: list[tuple[tuple, pa.RecordBatch]]) -> pa.Table:
    rows = pa.Table.from_batches([b for _, b in found], desc.top_row_schema())
    counts = [b.num_rows for _, b in found]
    keys = [k for (k, _), c in zip(found, counts) for _ in range(c)]
    cols: dict[str, pa.Array] = dict(zip(desc.key_columns, key_columns_from_plain(keys, desc.key_fields())))
    cols[desc.rank_column] = pa.array(np.concatenate([np.arange(1, c + 1) for c in counts]) if counts
                                      else np.array([], np.int64), pa.int64())
    for name in rows.column_names:
        cols.setdefault(name, rows.column(name))
    return pa.table([cols[f.name] for f in schema], schema=schema)
