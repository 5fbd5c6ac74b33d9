"""Decode one subtask's stored entries (key order, as a store scan yields them) into
Arrow tables of the operator's state schema (`sparkpoint.state.descriptor`). Pure:
no Spark, no RocksDB; the caller brings the entries.

Tables come out in batches of about `batch_rows` rows. Stored keys sort by key group
first, and a key's states (one namespace each) all sit in its key group, so a
processor's row is complete once the scan leaves the key group: batches are cut only
there.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa

from sparkpoint.state.codec import FixedWidthCodec, RowCodec
from sparkpoint.state.descriptor import OperatorStateSchema, StateVariable
from sparkpoint.state.key_decode import decode_user_key, split_key, split_namespace
from sparkpoint.state.keys import decode_timestamp, key_columns_from_plain

# Namespaces and record layouts of the built-in operators (sparkpoint.api.aggregate,
# sparkpoint.api.window, sparkpoint.api.processor).
_AGG_NS, _WINDOW_NS, _FIRE_NS, _CLEANUP_NS = "agg", "win", "win-fire", "win-cleanup"
_TIMERS_NS = "~timers"

Entries = Iterable[tuple[bytes, bytes]]


def read_state(entries: Entries, desc: OperatorStateSchema, batch_rows: int = 4096) -> Iterator[pa.Table]:
    if desc.type == "aggregate":
        return _read_records(entries, desc, _AGG_NS, batch_rows)
    if desc.type == "window":
        return _read_records(entries, desc, _WINDOW_NS, batch_rows)
    return _read_processor(entries, desc, batch_rows)


def read_timers(entries: Entries, desc: OperatorStateSchema, batch_rows: int = 4096) -> Iterator[pa.Table]:
    schema = desc.timer_schema()
    types = [f.type for f in desc.key_fields()]
    wanted = {_TIMERS_NS} if desc.type == "processor" else {_FIRE_NS, _CLEANUP_NS}
    rows: list[tuple[tuple, int, str]] = []
    for key, _ in entries:
        _, ns, at = split_namespace(key)
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
