"""Stream-stream joins: `IntervalJoin`, `WindowJoin` and `StreamJoin`.

A join is a keyed stateful step with two inputs. `prepare_input(left_df, right_df)`
builds, in Spark, one keyed DataFrame: the tagged union of both sides,

    __side   TINYINT   0 for a left row, 1 for a right row
    <keys>   the join key values under the left side's key names (Spark's union widens
             the two sides' key types to a common type)
    __left   STRUCT    the whole left row (null on right rows)
    __right  STRUCT    the whole right row (null on left rows)

and the runtime then runs it like any one-input keyed step (key groups from the key
columns, `apply` per subtask per epoch). `tag_rows` builds the same table in Arrow,
for the test harness.

Output rows are the joined columns, flattened: every left column, then every right
column. A key that both sides call by the same name (`left_on="id", right_on="id"`)
appears once, at its left position, holding the key of whichever side is present (SQL's
`USING`). Any other name both sides have gets `suffixes[0]` on the left column and
`suffixes[1]` on the right one (default `("", "_right")`: the right one is renamed).
Both sides' event-time columns stay in the output, so a window after the join can use
either.

State: each side's rows sit under `<key group><namespace><user key><time><row id>`
(state/keys.py), the value one row as an Arrow IPC record-batch message (schema kept
once in the store's metadata, never pickled); a second namespace orders the same rows
by time, so clean-up by the watermark is one range scan per key group. Row ids are
`<epoch><position in the epoch's input>`, unique per key group, so state moves between
subtasks on rescale with its key groups. Nothing is kept in Python between epochs.

Null keys never match (SQL). Rows without an event time, and rows whose event time is
below the watermark (late), can never be joined completely: the event-time joins drop
and count them (`dropped_count`, the job's late-record count for the step).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api import event_time
from sparkpoint.api.aggregate import KeySchema, require_key_groups
from sparkpoint.api.durations import duration_ms, signed_duration_ms
from sparkpoint.errors import ConfigError
from sparkpoint.state.interfaces import KEY_GROUP_COL, EpochContext, StatefulOperator
from sparkpoint.state.keys import (decode_timestamp, encode_timestamp, encode_user_keys, group_prefix,
                                   key_group_range, namespace)
from sparkpoint.state.stored import StoredCounter

SIDE_COL = "__side"
LEFT_COL = "__left"
RIGHT_COL = "__right"
LEFT, RIGHT = 0, 1
WINDOW_START = "window_start"
WINDOW_END = "window_end"
HOWS = ("inner", "left", "right")

_INPUT_SCHEMA_META = "join_input_schema"
_DROPPED = StoredCounter("join_dropped")
_UNMATCHED, _MATCHED = b"\x00", b"\x01"  # an interval-join row's last value byte
_ID_LEN = 12  # <epoch: 8><position: 4>
_TS_LEN = 8
_RESERVED = (SIDE_COL, LEFT_COL, RIGHT_COL, KEY_GROUP_COL)


def _column_list(value: str | Sequence[str], what: str) -> list[str]:
    cols = [value] if isinstance(value, str) else list(value)
    if not cols or not all(isinstance(c, str) and c for c in cols):
        raise ConfigError(f"{what} must name one column or a non-empty list of columns, got {value!r}")
    return cols


def _row_id(epoch: int, position: int) -> bytes:
    return encode_timestamp(epoch) + int(position).to_bytes(4, "big")


def _nulls(schema: pa.Schema, n: int) -> pa.Table:
    return pa.Table.from_arrays([pa.nulls(n, f.type) for f in schema], schema=schema)


class _Arrivals:
    """One side's rows of an epoch: the rows (the side's own columns), their event
    time, key group and encoded user key, and the row ids they get in state."""

    def __init__(self, rows: pa.Table, positions: np.ndarray, times: np.ndarray | None,
                 has_time: np.ndarray, has_key: np.ndarray, groups: np.ndarray, user_keys: list[bytes],
                 ids: list[bytes]):
        self.rows, self.positions, self.times, self.has_time = rows, positions, times, has_time
        self.has_key, self.groups, self.user_keys, self.ids = has_key, groups, user_keys, ids

    def by_key(self, selected: np.ndarray) -> dict[tuple[int, bytes], list[int]]:
        """Indexes of the selected rows, per (key group, user key), in arrival order."""
        out: dict[tuple[int, bytes], list[int]] = defaultdict(list)
        for i in np.flatnonzero(selected):
            out[(int(self.groups[i]), self.user_keys[i])].append(int(i))
        return out


class _Join(StatefulOperator):
    """What the three joins share: the tagged input, the output columns, the row codec."""

    input_arity = 2
    requires_event_time = False
    _kind = "join"
    _hows: tuple[str, ...] = ("inner",)

    def __init__(self, name: str, left_on: str | Sequence[str], right_on: str | Sequence[str],
                 how: str, suffixes: Sequence[str], times: tuple[str | None, str | None] = (None, None)):
        self.name = name
        self.left_on = _column_list(left_on, f"{self._what(name)} left_on")
        self.right_on = _column_list(right_on, f"{self._what(name)} right_on")
        if len(self.left_on) != len(self.right_on):
            raise ConfigError(f"{self._what(name)}: left_on {self.left_on} and right_on {self.right_on} must name "
                              "as many columns each (the i-th left key is compared with the i-th right key)")
        if how not in self._hows:
            raise ConfigError(f"{self._what(name)}: how={how!r} is not supported; use one of {list(self._hows)}")
        suffixes = tuple(suffixes)
        if len(suffixes) != 2 or not all(isinstance(s, str) for s in suffixes) or suffixes[0] == suffixes[1]:
            raise ConfigError(f"{self._what(name)}: suffixes must be two different strings such as ('', '_right'), "
                              f"got {suffixes!r}")
        reserved = [c for c in self.left_on if c in _RESERVED]
        if reserved:
            raise ConfigError(f"{self._what(name)}: key column(s) {reserved} use names the join reserves; rename them")
        self.how = how
        self.suffixes = suffixes
        self.times = times
        # The tagged union carries the keys under the left side's names.
        self.key_columns = list(self.left_on)
        self.keys = KeySchema(name, self.key_columns)
        self._input: pa.Schema | None = None  # the tagged input schema
        self._stored: pa.Schema | None = None  # the one the rows in state were written with
        self._time_kinds: tuple[str, str] = (event_time.MS, event_time.MS)
        self._out: pa.Schema | None = None
        k = self._kind
        self._ns = (namespace(f"{k}-left"), namespace(f"{k}-right"))
        self._ns_by_time = (namespace(f"{k}-left-by-time"), namespace(f"{k}-right-by-time"))

    @classmethod
    def _what(cls, name: str) -> str:
        return f"{cls.__name__} {name!r}"

    def _outer(self, side: int) -> bool:
        return (self.how == "left" and side == LEFT) or (self.how == "right" and side == RIGHT)

    # -- Spark side -------------------------------------------------------------------
    def prepare_input(self, left_df, right_df):
        """The tagged union of both sides (module docstring), as one Spark DataFrame."""
        from pyspark.sql import functions as F

        for df, cols, side in ((left_df, self.left_on, "left"), (right_df, self.right_on, "right")):
            missing = [c for c in cols if c not in df.columns]
            if missing:
                raise ConfigError(f"{self._what(self.name)}: {side} key column(s) {missing} are not in the {side} "
                                  f"input (its columns: {df.columns})")
        for df, column, side in ((left_df, self.times[0], "left"), (right_df, self.times[1], "right")):
            if column is not None:
                event_time.spark_kind(df.schema, column, f"{self._what(self.name)} {side} time")

        def row(df):
            return F.struct(*[F.col(f"`{c}`") for c in df.columns])

        left_type = left_df.select(row(left_df).alias("r")).schema["r"].dataType
        right_type = right_df.select(row(right_df).alias("r")).schema["r"].dataType
        left = left_df.select(F.lit(LEFT).cast("tinyint").alias(SIDE_COL),
                              *[F.col(f"`{c}`").alias(k) for c, k in zip(self.left_on, self.key_columns)],
                              row(left_df).alias(LEFT_COL), F.lit(None).cast(right_type).alias(RIGHT_COL))
        right = right_df.select(F.lit(RIGHT).cast("tinyint").alias(SIDE_COL),
                                *[F.col(f"`{c}`").alias(k) for c, k in zip(self.right_on, self.key_columns)],
                                F.lit(None).cast(left_type).alias(LEFT_COL), row(right_df).alias(RIGHT_COL))
        return left.unionByName(right)

    def tag_rows(self, left: Any, right: Any) -> pa.Table:
        """`prepare_input` in Arrow, for the test harness: `left` and `right` are Arrow
        tables or pandas DataFrames of each side's rows (either may have no rows, but
        must have its columns)."""
        left_t, right_t = _to_arrow(left), _to_arrow(right)
        for table, cols, side in ((left_t, self.left_on, "left"), (right_t, self.right_on, "right")):
            missing = [c for c in cols if c not in table.column_names]
            if missing:
                raise ConfigError(f"{self._what(self.name)}: {side} key column(s) {missing} are not in the {side} "
                                  f"rows (their columns: {table.column_names})")
        key_types = []
        for lc, rc in zip(self.left_on, self.right_on):
            lt, rt = left_t.schema.field(lc).type, right_t.schema.field(rc).type
            key_types.append(lt if lt == rt else pa.unify_schemas(
                [pa.schema([("k", lt)]), pa.schema([("k", rt)])], promote_options="permissive").field("k").type)
        left_row = pa.struct(list(left_t.schema))
        right_row = pa.struct(list(right_t.schema))

        def tagged(table: pa.Table, side: int, key_cols: list[str]) -> pa.Table:
            n = table.num_rows
            own = pa.StructArray.from_arrays([table.column(c).combine_chunks() for c in table.column_names],
                                             fields=list(table.schema)) if n else pa.array([], table_type(side))
            cols: dict[str, Any] = {SIDE_COL: pa.array(np.full(n, side, dtype=np.int8))}
            for c, k, t in zip(key_cols, self.key_columns, key_types):
                cols[k] = table.column(c).cast(t)
            cols[LEFT_COL] = own if side == LEFT else pa.nulls(n, left_row)
            cols[RIGHT_COL] = own if side == RIGHT else pa.nulls(n, right_row)
            return pa.table(cols)

        def table_type(side: int) -> pa.DataType:
            return left_row if side == LEFT else right_row

        return pa.concat_tables([tagged(left_t, LEFT, self.left_on), tagged(right_t, RIGHT, self.right_on)])

    # -- schemas ------------------------------------------------------------------------
    def resolve_input_schema(self, schema: pa.Schema) -> None:
        missing = [c for c in (SIDE_COL, *self.key_columns, LEFT_COL, RIGHT_COL) if c not in schema.names]
        if missing:
            raise ConfigError(f"{self._what(self.name)}: its input lacks {missing}; a join reads the tagged union "
                              "that prepare_input(left, right) builds (or tag_rows in the test harness)")
        sides = [schema.field(c).type for c in (LEFT_COL, RIGHT_COL)]
        if not all(pa.types.is_struct(t) for t in sides):
            raise ConfigError(f"{self._what(self.name)}: {LEFT_COL} and {RIGHT_COL} must be struct columns, "
                              f"got {sides[0]} and {sides[1]}")
        left, right = (pa.schema(list(t)) for t in sides)
        for side_schema, cols, side in ((left, self.left_on, "left"), (right, self.right_on, "right")):
            absent = [c for c in cols if c not in side_schema.names]
            if absent:
                raise ConfigError(f"{self._what(self.name)}: {side} key column(s) {absent} are not in the {side} "
                                  f"rows (their columns: {side_schema.names})")
        kinds = []
        for side_schema, column, side in ((left, self.times[0], "left"), (right, self.times[1], "right")):
            kinds.append(event_time.MS if column is None else
                         event_time.arrow_kind(side_schema, column, f"{self._what(self.name)} {side} time"))
        self.keys.resolve(schema)
        self._time_kinds = (kinds[0], kinds[1])
        self._input = pa.schema([schema.field(SIDE_COL), *[schema.field(k) for k in self.key_columns],
                                 pa.field(LEFT_COL, sides[0]), pa.field(RIGHT_COL, sides[1])])
        self._out = self._output_fields(left, right)

    def _side_schema(self, side: int, schema: pa.Schema | None = None) -> pa.Schema:
        schema = schema or self._input
        assert schema is not None
        return pa.schema(list(schema.field(LEFT_COL if side == LEFT else RIGHT_COL).type))

    def _stored_side(self, side: int) -> pa.Schema:
        return self._side_schema(side, self._stored)

    def _output_fields(self, left: pa.Schema, right: pa.Schema) -> pa.Schema:
        shared = {lc for lc, rc in zip(self.left_on, self.right_on) if lc == rc}
        right_kept = [f for f in right if f.name not in shared]
        clash = set(left.names) & {f.name for f in right_kept}
        fields = []
        self._left_out: list[tuple[str, str, bool]] = []   # (column in the left row, output name, shared key)
        self._right_out: list[tuple[str, str]] = []
        for f in left:
            out = f.name + (self.suffixes[0] if f.name in clash else "")
            typ = self.keys.schema.field(f.name).type if f.name in shared else f.type  # type: ignore[union-attr]
            fields.append(pa.field(out, typ))
            self._left_out.append((f.name, out, f.name in shared))
        for f in right_kept:
            out = f.name + (self.suffixes[1] if f.name in clash else "")
            fields.append(pa.field(out, f.type))
            self._right_out.append((f.name, out))
        fields += self._extras()
        names = [f.name for f in fields]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"{self._what(self.name)}: the joined rows would have column(s) {dupes} twice; "
                              f"rename them on one side first or pass other suffixes= (now {self.suffixes})")
        return pa.schema(fields)

    def _extras(self) -> list[pa.Field]:
        return []

    @property
    def output_schema(self) -> pa.Schema:
        if self._out is None:
            raise ConfigError(f"{self._what(self.name)} does not know its input columns yet: the runtime calls "
                              "resolve_input_schema with the schema of prepare_input's DataFrame first")
        return self._out

    # -- worker side: state -----------------------------------------------------------
    @staticmethod
    def dropped_count(store) -> int:
        """Rows dropped so far as late or without event time (committed + this epoch)."""
        return _DROPPED.value(store)

    def _count_dropped(self, store, n: int) -> None:
        _DROPPED.add(store, n)

    def _ensure(self, store, rows: pa.Table) -> None:
        """Know the input's types in a worker: the rows in state are decoded with the
        schema they were written with, kept in the store's metadata (Arrow IPC schema
        bytes), so a restored operator that has not seen rows yet reads them too."""
        if self._input is None and LEFT_COL in rows.column_names:
            self.resolve_input_schema(rows.schema)
        self.keys.ensure(store, rows)  # the key types, where every keyed step records them for the state reader
        raw = store.get_meta(_INPUT_SCHEMA_META)
        if raw is not None:
            self._stored = pa.ipc.read_schema(pa.py_buffer(raw))
            if self._input is None:
                self.resolve_input_schema(self._stored)
        elif self._input is not None:
            self._stored = self._input
            store.put_meta(_INPUT_SCHEMA_META, self._input.serialize().to_pybytes())

    def _arrivals(self, rows: pa.Table, side: int, epoch: int) -> _Arrivals:
        mask = pc.equal(rows.column(SIDE_COL), side)
        positions = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
        mine = rows.take(pa.array(positions, pa.int64()))
        own = mine.column(LEFT_COL if side == LEFT else RIGHT_COL).combine_chunks()
        schema = self._side_schema(side)
        side_rows = self._cast(pa.Table.from_batches([pa.RecordBatch.from_struct_array(own)]), schema, side) \
            if len(own) else schema.empty_table()
        n = len(positions)
        has_key = np.ones(n, dtype=bool)
        for k in self.key_columns:
            has_key &= pc.is_valid(mine.column(k)).to_numpy(zero_copy_only=False)
        time_col = self.times[side]
        if time_col is not None:
            ms = event_time.arrow_ms(side_rows.column(time_col))
            has_time = pc.is_valid(ms).to_numpy(zero_copy_only=False)
            times = pc.fill_null(ms, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            has_time, times = np.ones(n, dtype=bool), None
        groups = mine.column(KEY_GROUP_COL).to_numpy(zero_copy_only=False).astype(np.int64)
        user_keys = encode_user_keys(self.keys.cast_keys(mine.select(self.key_columns)), self.key_columns)
        ids = [_row_id(epoch, int(p)) for p in positions]
        return _Arrivals(side_rows, positions, times, has_time, has_key, groups, user_keys, ids)

    def _encode(self, side: int, side_rows: pa.Table) -> list[bytes]:
        """One Arrow IPC record-batch message per row, in the types the state was begun
        with (that schema is in the store's metadata)."""
        if not side_rows.num_rows:
            return []
        stored = self._stored_side(side)
        batch = self._cast(side_rows, stored, side).combine_chunks().to_batches()[0]
        return [batch.slice(i, 1).serialize().to_pybytes() for i in range(side_rows.num_rows)]

    def _decode(self, side: int, values: Iterable[bytes], trailing: int = 0) -> pa.Table:
        stored = self._stored_side(side)
        # A row met by several rows is in `values` once per pair: decoded once.
        unique: dict[bytes, int] = {}
        order = [unique.setdefault(v, len(unique)) for v in values]
        batches = []
        for v in unique:
            buf = pa.py_buffer(v)
            batches.append(pa.ipc.read_record_batch(buf.slice(0, len(v) - trailing) if trailing else buf, stored))
        table = pa.Table.from_batches(batches, stored) if batches else stored.empty_table()
        if len(unique) < len(order):
            table = table.take(pa.array(order, pa.int64()))
        return self._cast(table, self._side_schema(side), side)

    def _cast(self, table: pa.Table, schema: pa.Schema, side: int) -> pa.Table:
        if table.schema == schema:
            return table
        try:
            return table.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
            raise ConfigError(f"{self._what(self.name)}: its {('left', 'right')[side]} rows changed columns since its "
                              f"state began ({table.schema} cannot be read as {schema}: {e}); keep the input's "
                              "columns, or give the step a new name to start its state from empty") from None

    # -- output -----------------------------------------------------------------------
    def _joined(self, left: pa.Table, right: pa.Table, extra: Sequence[pa.Array] = ()) -> pa.Table:
        """Output rows from aligned left and right rows (either side all nulls for an
        unmatched row)."""
        schema = self.output_schema
        right_of = dict(zip(self.left_on, self.right_on))
        cols = []
        for (column, _, shared), field in zip(self._left_out, schema):
            col = left.column(column)
            if shared:
                col = pc.coalesce(col.cast(field.type), right.column(right_of[column]).cast(field.type))
            cols.append(col)
        cols += [right.column(column) for column, _ in self._right_out]
        cols += list(extra)
        return pa.Table.from_arrays(cols, schema=schema)

    def _unmatched(self, side: int, rows: pa.Table) -> pa.Table:
        other = _nulls(self._side_schema(1 - side), rows.num_rows)
        return self._joined(rows, other) if side == LEFT else self._joined(other, rows)

    def _finish(self, parts: list[pa.Table]) -> pa.Table:
        parts = [p for p in parts if p.num_rows]
        return pa.concat_tables(parts) if parts else self.output_schema.empty_table()

    def _empty_epoch(self, rows: pa.Table) -> bool:
        if self._input is None:
            if rows.num_rows:
                raise ConfigError(f"{self._what(self.name)}: its input lacks {LEFT_COL}/{RIGHT_COL}; a join reads the "
                                  "tagged union that prepare_input(left, right) builds (tag_rows in the harness)")
            return True
        return False


class IntervalJoin(_Join):
    """Flink's interval join (`between(lower, upper)`): a left row `a` meets each right
    row `b` of the same key with `a.time + lower <= b.time <= a.time + upper`.

    - Each pair is emitted once, in the epoch in which its second row arrives.
    - A row whose event time is below the watermark is late: it could miss partners
      already cleaned up, so it is dropped and counted (Flink drops it too).
    - A left row is kept while right rows can still match it (`a.time + upper >=
      watermark`), a right row while `b.time - lower >= watermark`; then it is removed.
    - `how="left"` / `"right"`: a row of the outer side that found no partner is emitted
      once, with nulls for the other side, when the watermark passes the end of its
      match interval (the removal above), or at the end of input. An outer row with a
      null key can match nothing: it is emitted at once.
    """

    requires_event_time = True
    _kind = "ijoin"
    _hows = HOWS

    def __init__(self, name: str, left_on: str | Sequence[str], right_on: str | Sequence[str], left_time: str,
                 right_time: str, lower: int | str, upper: int | str, how: str = "inner", *,
                 suffixes: Sequence[str] = ("", "_right")):
        super().__init__(name, left_on, right_on, how, suffixes, (left_time, right_time))
        self.lower = signed_duration_ms(lower, f"{self._what(name)} lower")
        self.upper = signed_duration_ms(upper, f"{self._what(name)} upper")
        if self.lower > self.upper:
            raise ConfigError(f"{self._what(name)}: lower ({self.lower} ms) must not exceed upper ({self.upper} ms)")

    def _partner_offsets(self, side: int) -> tuple[int, int]:
        """Partners of a row at time t lie in [t + lo, t + hi] on the other side."""
        return (self.lower, self.upper) if side == LEFT else (-self.upper, -self.lower)

    def _kept_from(self, side: int, watermark: int) -> int:
        """Rows of `side` with time below this can match no row that is not late."""
        return watermark - self.upper if side == LEFT else watermark + self.lower

    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        self._ensure(store, rows)
        if self._empty_epoch(rows):
            return pa.table({})
        watermark = ctx.watermark_ms
        out: list[pa.Table] = []
        if rows.num_rows:
            require_key_groups(rows, self.name)
            dropped = 0
            for side in (LEFT, RIGHT):
                new = self._arrivals(rows, side, ctx.epoch)
                on_time = new.has_time & (True if watermark is None else new.times >= watermark)  # type: ignore
                dropped += int((~on_time).sum())
                if self._outer(side):  # a null key never matches: unmatched at once
                    out.append(self._unmatched(side, new.rows.filter(pa.array(on_time & ~new.has_key))))
                out += self._arrive(store, side, new, on_time & new.has_key)
            self._count_dropped(store, dropped)
        if ctx.final or watermark is not None:
            out += self._clean_up(store, key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism),
                                  None if ctx.final else watermark)
        return self._finish(out)

    def _arrive(self, store, side: int, new: _Arrivals, live: np.ndarray) -> list[pa.Table]:
        """Join `side`'s new rows with the other side's buffered rows, then buffer them."""
        other = 1 - side
        lo, hi = self._partner_offsets(side)
        matched = np.zeros(new.rows.num_rows, dtype=bool)
        # The epoch's pairs, gathered over all keys so the rows are decoded and joined
        # once (Arrow calls per key would cost more than the matching).
        mine_idx: list[int] = []
        their_values: list[bytes] = []
        flag_keys: list[bytes] = []
        flag_values: list[bytes] = []
        for (group, user_key), idx in new.by_key(live).items():
            times = new.times[idx]  # type: ignore[index]
            prefix = group_prefix(group, self._ns[other]) + user_key
            entries = list(store.scan_range(prefix + encode_timestamp(times.min() + lo),
                                            prefix + encode_timestamp(times.max() + hi + 1)))
            if not entries:
                continue
            # The scan returns the key's rows in time order: each new row's partners are
            # one contiguous run of them.
            theirs = np.array([decode_timestamp(k[len(prefix):]) for k, _ in entries], dtype=np.int64)
            first = np.searchsorted(theirs, times + lo, "left")
            counts = np.searchsorted(theirs, times + hi, "right") - first
            total = int(counts.sum())
            if not total:
                continue
            matched[np.asarray(idx)[counts > 0]] = True
            mine_idx += np.repeat(idx, counts).tolist()
            js = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(first, counts)
            their_values += [entries[j][1] for j in js]
            if self._outer(other):  # those buffered rows have their partner now
                for j in np.unique(js):
                    key, value = entries[j]
                    if value[-1:] == _UNMATCHED:
                        flag_keys.append(key)
                        flag_values.append(value[:-1] + _MATCHED)
        if flag_keys:
            store.put_many(flag_keys, flag_values)
        out = []
        if mine_idx:
            mine_rows = new.rows.take(pa.array(mine_idx, pa.int64()))
            their_rows = self._decode(other, their_values, trailing=1)
            out.append(self._joined(mine_rows, their_rows) if side == LEFT else self._joined(their_rows, mine_rows))
        idx = np.flatnonzero(live)
        if len(idx):
            values = self._encode(side, new.rows.take(pa.array(idx, pa.int64())))
            keys, index_keys, flagged = [], [], []
            for i, value in zip(idx, values):
                ts = encode_timestamp(int(new.times[i]))  # type: ignore[index]
                group, user_key, rid = int(new.groups[i]), new.user_keys[i], new.ids[i]
                keys.append(group_prefix(group, self._ns[side]) + user_key + ts + rid)
                index_keys.append(group_prefix(group, self._ns_by_time[side]) + ts + user_key + rid)
                flagged.append(value + (_MATCHED if matched[i] else _UNMATCHED))
            store.put_many(keys, flagged)
            store.put_many(index_keys, [b""] * len(index_keys))
        return out

    def _clean_up(self, store, groups: range, watermark: int | None) -> list[pa.Table]:
        """Remove the rows that can match no more rows (all of them at the end of input);
        emit the outer side's unmatched ones."""
        out = []
        for side in (LEFT, RIGHT):
            doomed_index: list[bytes] = []
            doomed: list[bytes] = []
            for g in groups:
                prefix = group_prefix(g, self._ns_by_time[side])
                found = store.scan_prefix(prefix) if watermark is None else \
                    store.scan_range(prefix, prefix + encode_timestamp(self._kept_from(side, watermark)))
                data_prefix = group_prefix(g, self._ns[side])
                for key, _ in found:
                    rest = key[len(prefix):]
                    ts, user_key, rid = rest[:_TS_LEN], rest[_TS_LEN:-_ID_LEN], rest[-_ID_LEN:]
                    doomed_index.append(key)
                    doomed.append(data_prefix + user_key + ts + rid)
            if not doomed:
                continue
            if self._outer(side):
                values = store.get_many(doomed)
                lonely = [v for v in values if v is not None and v[-1:] == _UNMATCHED]
                if lonely:
                    out.append(self._unmatched(side, self._decode(side, lonely, trailing=1)))
            # Deleted after all scans of the side: a write between scans makes the next
            # scan merge the epoch's writes again.
            store.delete_many(doomed_index + doomed)
        return out


class WindowJoin(_Join):
    """Flink's window join: a left and a right row of the same key meet when they fall
    into the same event-time window, tumbling (`size`) or hopping (`size`, `slide`).
    Windows are [start, end) with start a multiple of `slide` (of `size` when
    tumbling). A window's pairs are emitted once, when the watermark reaches its end
    (end <= watermark, as `TumblingWindow` fires), or at the end of input; its rows are
    removed then. A row is late for a window that has fired; a row late for all its
    windows (or without event time) is dropped and counted. Output: the joined
    columns, then `window_start` and `window_end`, of the left time column's kind.
    """

    requires_event_time = True
    _kind = "wjoin"

    def __init__(self, name: str, left_on: str | Sequence[str], right_on: str | Sequence[str], left_time: str,
                 right_time: str, size: int | str, slide: int | str | None = None, *,
                 suffixes: Sequence[str] = ("", "_right")):
        super().__init__(name, left_on, right_on, "inner", suffixes, (left_time, right_time))
        self.size_ms = duration_ms(size, f"{self._what(name)} size")
        self.slide_ms = self.size_ms if slide is None else duration_ms(slide, f"{self._what(name)} slide")
        if self.size_ms <= 0 or self.slide_ms <= 0:
            raise ConfigError(f"{self._what(name)}: size and slide must be > 0 (got {self.size_ms} ms, "
                              f"{self.slide_ms} ms)")
        self._ns_fire = namespace(f"{self._kind}-fire")

    def _extras(self) -> list[pa.Field]:
        bound = event_time.arrow_type(self._time_kinds[0])
        return [pa.field(WINDOW_START, bound), pa.field(WINDOW_END, bound)]

    def _window_starts(self, t: int) -> list[int]:
        last = t - t % self.slide_ms  # Python's % floors, also for t < 0
        starts = []
        s = last
        while s > t - self.size_ms:
            starts.append(s)
            s -= self.slide_ms
        return starts[::-1]

    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        self._ensure(store, rows)
        if self._empty_epoch(rows):
            return pa.table({})
        watermark = ctx.watermark_ms
        if rows.num_rows:
            require_key_groups(rows, self.name)
            dropped = 0
            for side in (LEFT, RIGHT):
                dropped += self._arrive(store, side, self._arrivals(rows, side, ctx.epoch), watermark)
            self._count_dropped(store, dropped)
        out: list[pa.Table] = []
        if ctx.final or watermark is not None:
            out = self._fire(store, key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism),
                             None if ctx.final else watermark)
        return self._finish(out)

    def _arrive(self, store, side: int, new: _Arrivals, watermark: int | None) -> int:
        """Buffer `side`'s new rows in their windows; return how many were dropped."""
        dropped = 0
        keys: list[bytes] = []
        values: list[bytes] = []
        fire_keys: set[bytes] = set()
        encoded = self._encode(side, new.rows)
        for i in range(new.rows.num_rows):
            if not new.has_time[i]:
                dropped += 1
                continue
            starts = [s for s in self._window_starts(int(new.times[i]))  # type: ignore[index]
                      if watermark is None or s + self.size_ms > watermark]
            if not starts:
                dropped += 1
                continue
            if not new.has_key[i]:
                continue  # a null key meets nothing
            group, user_key = int(new.groups[i]), new.user_keys[i]
            for s in starts:
                keys.append(group_prefix(group, self._ns[side]) + user_key + encode_timestamp(s) + new.ids[i])
                values.append(encoded[i])
                fire_keys.add(group_prefix(group, self._ns_fire) + encode_timestamp(s + self.size_ms) + user_key)
        store.put_many(keys, values)
        ordered = sorted(fire_keys)
        store.put_many(ordered, [b""] * len(ordered))
        return dropped

    def _fire(self, store, groups: range, watermark: int | None) -> list[pa.Table]:
        due: list[tuple[int, bytes, bytes]] = []
        for g in groups:
            prefix = group_prefix(g, self._ns_fire)
            found = store.scan_prefix(prefix) if watermark is None else \
                store.scan_range(prefix, prefix + encode_timestamp(watermark + 1))
            due += [(g, key, key[len(prefix):]) for key, _ in found]
        doomed: list[bytes] = []
        values: tuple[list[bytes], list[bytes]] = ([], [])
        starts: list[int] = []
        for g, fire_key, rest in due:
            end, user_key = decode_timestamp(rest[:_TS_LEN]), rest[_TS_LEN:]
            start = end - self.size_ms
            found = []
            for side in (LEFT, RIGHT):
                entries = list(store.scan_prefix(group_prefix(g, self._ns[side]) + user_key + encode_timestamp(start)))
                doomed += [k for k, _ in entries]
                found.append([v for _, v in entries])
            doomed.append(fire_key)
            for left_value in found[0]:  # every pair of the window
                values[LEFT].extend([left_value] * len(found[1]))
                values[RIGHT].extend(found[1])
                starts.extend([start] * len(found[1]))
        store.delete_many(doomed)
        if not starts:
            return []
        kind = self._time_kinds[0]
        at = np.array(starts, dtype=np.int64)
        return [self._joined(self._decode(LEFT, values[LEFT]), self._decode(RIGHT, values[RIGHT]),
                             [event_time.arrow_from_ms(at, kind), event_time.arrow_from_ms(at + self.size_ms, kind)])]


class StreamJoin(_Join):
    """A regular inner join: every left row meets every right row of the same key,
    across all time; a pair is emitted in the epoch in which its second row arrives.

    Without `ttl` every row is kept forever (state grows with the input). With `ttl`
    (a duration), state time-to-live as Flink's `table.exec.state.ttl` gives a regular
    join: in processing time, a row is forgotten `ttl` after the epoch that brought it
    (a join row is written once and never updated, so Flink's "idle since the last
    write" is "since it arrived"), and a row forgotten matches no later row. Event time
    plays no part (`requires_event_time = False`); the rows' time columns pass through.
    """

    _kind = "sjoin"

    def __init__(self, name: str, left_on: str | Sequence[str], right_on: str | Sequence[str],
                 ttl: int | str | None = None, how: str = "inner", *, suffixes: Sequence[str] = ("", "_right")):
        super().__init__(name, left_on, right_on, how, suffixes)
        self.ttl_ms = None if ttl is None else duration_ms(ttl, f"{self._what(name)} ttl")
        if self.ttl_ms is not None and self.ttl_ms <= 0:
            raise ConfigError(f"{self._what(name)}: ttl must be > 0 (got {self.ttl_ms} ms); leave it out to keep rows")

    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        self._ensure(store, rows)
        if self._empty_epoch(rows):
            return pa.table({})
        now = ctx.processing_time_ms
        if self.ttl_ms is not None:
            self._expire(store, key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism), now)
        out: list[pa.Table] = []
        if rows.num_rows:
            require_key_groups(rows, self.name)
            for side in (LEFT, RIGHT):
                out += self._arrive(store, side, self._arrivals(rows, side, ctx.epoch), now)
        return self._finish(out)

    def _arrive(self, store, side: int, new: _Arrivals, now: int) -> list[pa.Table]:
        other = 1 - side
        mine_idx: list[int] = []
        their_values: list[bytes] = []
        for (group, user_key), idx in new.by_key(new.has_key).items():
            theirs = [v for _, v in store.scan_prefix(group_prefix(group, self._ns[other]) + user_key)]
            for i in idx:
                mine_idx += [i] * len(theirs)
                their_values += theirs
        out = []
        if mine_idx:
            mine = new.rows.take(pa.array(mine_idx, pa.int64()))
            theirs_rows = self._decode(other, their_values)
            out.append(self._joined(mine, theirs_rows) if side == LEFT else self._joined(theirs_rows, mine))
        idx = np.flatnonzero(new.has_key)
        if len(idx):
            values = self._encode(side, new.rows.take(pa.array(idx, pa.int64())))
            keys = [group_prefix(int(new.groups[i]), self._ns[side]) + new.user_keys[i] + new.ids[i] for i in idx]
            store.put_many(keys, values)
            if self.ttl_ms is not None:
                expires = encode_timestamp(now + self.ttl_ms)
                store.put_many([group_prefix(int(new.groups[i]), self._ns_by_time[side]) + expires
                                + new.user_keys[i] + new.ids[i] for i in idx], [b""] * len(idx))
        return out

    def _expire(self, store, groups: range, now: int) -> None:
        """Forget every row whose time to live has run out (expiry <= now)."""
        doomed: list[bytes] = []
        for side in (LEFT, RIGHT):
            for g in groups:
                prefix = group_prefix(g, self._ns_by_time[side])
                data_prefix = group_prefix(g, self._ns[side])
                for key, _ in store.scan_range(prefix, prefix + encode_timestamp(now + 1)):
                    doomed.append(key)
                    doomed.append(data_prefix + key[len(prefix) + _TS_LEN:])
        store.delete_many(doomed)


def _to_arrow(rows: Any) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    import pandas as pd

    if isinstance(rows, pd.DataFrame):
        return pa.Table.from_pandas(rows, preserve_index=False)
    raise ConfigError(f"expected an Arrow table or a pandas DataFrame of one side's rows, got {type(rows).__name__}")
