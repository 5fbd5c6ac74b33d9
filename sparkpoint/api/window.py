"""`TumblingWindow`: per-key event-time tumbling windows with Flink's lateness rules.

Per epoch with watermark W (`ctx.watermark_ms`):
  1. merge: Spark pre-aggregates each epoch to one partial per (key, window_start);
     a partial whose window_end + allowed_lateness <= W is late beyond lateness: it is
     dropped and counted (`dropped_count(store)`); the others are merged into state.
  2. fire: every window not yet fired with window_end <= W is emitted once; a window
     that already fired and was updated in step 1 (late within lateness) is emitted
     again with its updated totals (Flink's late firing).
  3. clean up: a window's state is deleted once window_end + allowed_lateness <= W —
     exactly when any further partial for it would be dropped (without lateness,
     Flink's default, as it fires).
`ctx.final` fires and cleans up every window.

State (sparkpoint/state/window_tables.py): one entry per key group, an Arrow table of
the group's open windows (key columns, window_start, count, sum, fired). An epoch reads
the tables of the groups its partials touch and, when the watermark is set, of every
group the subtask owns (one get each), keeps those with new rows or a window due to
fire or to be cleaned up, and runs the three steps above as one vectorized pass over
them (a group-by merge, then masks); each changed group's table is written back whole,
or deleted when it holds no window. No per-window entries, no timer indexes: W2's
epochs were bound by those writes and by per-window Python. Stores of the per-window
layout are converted on their first epoch (`_convert_old_layout`).

Output columns: the key columns, window_start and window_end, count [, sum of
`value_column`]. Windows are [start, end), start = t - t mod size. The time column may
be a TIMESTAMP, a TIMESTAMP_NTZ or epoch ms in an integer column
(sparkpoint/api/event_time.py); window_start/window_end have the same kind (TIMESTAMP
in, TIMESTAMP out; integer ms in, BIGINT ms out). State holds epoch ms either way.

Event time and the watermark: the runtime computes the epoch's largest event time
with its own Spark aggregate over `event_time_ms(df)` (before `pre_aggregate`), and
passes the resulting watermark in `EpochContext.watermark_ms`. With no watermark
(None) nothing fires or is dropped until `ctx.final`.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api import event_time
from sparkpoint.api.aggregate import KeySchema, parse_value_type, require_key_groups
from sparkpoint.api.durations import duration_ms
from sparkpoint.errors import ConfigError
from sparkpoint.state import window_tables as tables
from sparkpoint.state.codec import FixedWidthCodec
from sparkpoint.state.interfaces import KEY_GROUP_COL, EpochContext, StatefulOperator
from sparkpoint.state.key_decode import decode_user_key
from sparkpoint.state.keys import (decode_fixed_user_keys, decode_timestamp, group_prefix, key_columns_from_plain,
                                   key_group_range, namespace)
from sparkpoint.state.stored import StoredCounter

WINDOW_START = "window_start"
WINDOW_END = "window_end"
P_COUNT, P_SUM = "__count", "__sum"
_NS_TABLE = namespace(tables.TABLE_NS)
# The per-window layout's namespaces (stores written before the table layout).
_NS_WINDOW, _NS_FIRE, _NS_CLEANUP = (namespace(n) for n in (tables.OLD_RECORD_NS, tables.OLD_FIRE_NS,
                                                          tables.OLD_CLEANUP_NS))
_DROPPED = StoredCounter("dropped")
_FIRED, _UPDATED = tables.FIRED, "__updated"  # _UPDATED: the window got rows this epoch


_TABLE_AGGS = (("count",), ("count", "sum"))


class TumblingWindow(StatefulOperator):
    def __new__(cls, *args: Any, **kwargs: Any):
        # Any Spark SQL aggregate, or an explicit output mode: the shared window engine
        # (api/windows/tumbling.py). Unpickling calls __new__ without arguments.
        if cls is TumblingWindow and (args or kwargs):
            bound = _SIGNATURE.bind(None, *args, **kwargs).arguments
            if bound.get("output_mode") is not None or tuple(bound.get("aggs", ("count",))) not in _TABLE_AGGS:
                from sparkpoint.api.windows.tumbling import TumblingWindow as EngineTumblingWindow

                return EngineTumblingWindow(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, name: str, key_columns: Sequence[str], time_column: str,
                 size_ms: int | str | None = None, allowed_lateness_ms: int | str = 0,
                 aggs: Sequence[str] = ("count",), value_column: str | None = None, *,
                 size: int | str | None = None, allowed_lateness: int | str | None = None,
                 value_type: str | pa.DataType = "double", key_schema: Any = None, output_mode: str | None = None):
        if (size_ms is None) == (size is None):
            raise ConfigError(f"TumblingWindow {name!r}: give the window size once, as size_ms=60000 "
                              "or size='60 s'")
        self.size_ms = duration_ms(size_ms if size is None else size, f"TumblingWindow {name!r} size")
        self.allowed_lateness_ms = duration_ms(allowed_lateness_ms if allowed_lateness is None
                                                else allowed_lateness, f"TumblingWindow {name!r} lateness")
        if self.size_ms <= 0 or self.allowed_lateness_ms < 0:
            raise ConfigError(f"TumblingWindow {name!r}: size must be > 0 and allowed lateness >= 0 "
                              f"(got {self.size_ms} ms, {self.allowed_lateness_ms} ms)")
        if "sum" in aggs and value_column is None:
            raise ConfigError(f"TumblingWindow {name!r}: aggs include 'sum' but value_column is not set")
        clash = [c for c in key_columns if c in (WINDOW_START, WINDOW_END, "count", "sum")]
        if clash:
            raise ConfigError(f"TumblingWindow {name!r}: key column(s) {clash} clash with output columns")
        self.name = name
        self.key_columns = list(key_columns)
        self.time_column = time_column
        self.aggs = tuple(aggs)
        self.value_column = value_column
        self.value_type = parse_value_type(value_type)
        self.keys = KeySchema(name, key_columns, key_schema)
        # How window bounds are output; set from the input schema on the driver before
        # the operator is shipped, so every worker outputs the same type.
        self.time_kind = event_time.MS

    def resolve_input_schema(self, schema: pa.Schema) -> None:
        self.keys.resolve(schema)
        if self.time_column in schema.names:  # else: already pre-aggregated (tests); Spark's side refuses it
            self.time_kind = event_time.arrow_kind(schema, self.time_column, self._used_for)

    @property
    def _used_for(self) -> str:
        return f"TumblingWindow {self.name!r}"

    @property
    def output_schema(self) -> pa.Schema:
        bound = event_time.arrow_type(self.time_kind)
        fields = [*self.keys.fields(), pa.field(WINDOW_START, bound), pa.field(WINDOW_END, bound),
                  pa.field("count", pa.int64())]
        if "sum" in self.aggs:
            fields.append(pa.field("sum", self.value_type))
        return pa.schema(fields)

    # -- Spark side -------------------------------------------------------------------
    def event_time_ms(self, df):
        """The event time of `df`'s rows in epoch ms, as a Spark Column."""
        return event_time.spark_ms(df, self.time_column, self._used_for)

    def pre_aggregate(self, df, carry=()):
        from pyspark.sql import functions as F

        ms = self.event_time_ms(df)
        start = (ms - F.pmod(ms, F.lit(self.size_ms))).alias(WINDOW_START)  # exact floor, also < 0
        aggs = [F.count(F.lit(1)).alias(P_COUNT)]
        if "sum" in self.aggs:
            aggs.append(F.sum(F.col(self.value_column).cast(
                "double" if pa.types.is_floating(self.value_type) else "bigint")).alias(P_SUM))
        return df.groupBy(*self.key_columns, start).agg(*aggs, *carry)

    # -- worker side ------------------------------------------------------------------
    @staticmethod
    def dropped_count(store) -> int:
        """Rows dropped so far as late beyond the allowed lateness (committed + this epoch)."""
        return _DROPPED.value(store)

    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        self.keys.ensure(store, rows)
        groups = key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism)
        converted = self._convert_old_layout(store, groups)
        partials = None
        if rows.num_rows:
            require_key_groups(rows, self.name)
            partials = self._partials(store, rows, ctx.watermark_ms)
        touched = set() if partials is None else set(np.unique(partials.column(KEY_GROUP_COL).to_numpy()).tolist())
        watermark = None if ctx.final else ctx.watermark_ms
        # Without a watermark nothing fires or is cleaned up: only groups with new rows change.
        wanted = sorted(touched | set(converted) | (set(groups) if ctx.final or watermark is not None else set()))
        held, changing, stored = self._held(store, wanted, touched, converted, watermark, ctx.final)
        if partials is None and not held:
            return self.output_schema.empty_table()
        windows = pa.concat_tables([*held, *([] if partials is None else [partials])])
        if partials is not None or converted:  # else each stored window is in one row already
            windows = _merged(windows, [*self.key_columns, KEY_GROUP_COL, WINDOW_START])
        starts = windows.column(WINDOW_START).to_numpy()
        fired = windows.column(_FIRED).to_numpy(zero_copy_only=False)
        updated = windows.column(_UPDATED).to_numpy(zero_copy_only=False)
        ends = starts + self.size_ms
        late_update = fired & updated  # fired before, updated now within lateness: fires again
        if ctx.final:
            emit = late_update | ~fired
            keep = np.zeros(len(starts), dtype=bool)
        elif watermark is None:
            emit = late_update
            keep = np.ones(len(starts), dtype=bool)
        else:
            emit = late_update | (~fired & (ends <= watermark))
            keep = ends + self.allowed_lateness_ms > watermark
        self._write_back(store, windows.filter(pa.array(keep)), fired[keep] | emit[keep], sorted(touched | changing),
                         stored)
        out = self._rows(windows.filter(pa.array(emit)))
        return out.sort_by([(WINDOW_START, "ascending"), *[(k, "ascending") for k in self.key_columns]])

    def _partials(self, store, rows: pa.Table, watermark: int | None) -> pa.Table:
        """The epoch's rows as windows to merge (key columns, key group, window_start, count,
        sum), late rows beyond lateness dropped and counted."""
        if WINDOW_START in rows.column_names:
            starts = rows.column(WINDOW_START).cast(pa.int64())
            counts = rows.column(P_COUNT).cast(pa.int64())
            sums = rows.column(P_SUM) if P_SUM in rows.column_names else None
        else:  # raw rows: one partial each
            ms = event_time.arrow_ms(rows.column(self.time_column))
            ms_np = pc.fill_null(ms, 0).to_numpy()
            starts = pa.array(ms_np - np.mod(ms_np, self.size_ms), mask=pc.is_null(ms).to_numpy(zero_copy_only=False))
            counts = pa.array(np.ones(rows.num_rows, dtype=np.int64))
            sums = rows.column(self.value_column) if self.value_column else None
        if sums is None:
            sums = pa.nulls(rows.num_rows, self._sum_type)
        keys = self.keys.cast_keys(rows.select(self.key_columns))
        columns = [_normalized(keys.column(k)) for k in self.key_columns]
        table = pa.Table.from_arrays(
            [*columns, rows.column(KEY_GROUP_COL).cast(pa.int32()), starts, counts,
             pc.fill_null(sums.cast(self.value_type).cast(self._sum_type), 0)],
            names=[*self.key_columns, KEY_GROUP_COL, WINDOW_START, P_COUNT, P_SUM])
        # Rows without an event time belong to no window.
        table = table.filter(pc.is_valid(table.column(WINDOW_START)))
        if watermark is not None and table.num_rows:
            late = table.column(WINDOW_START).to_numpy() + self.size_ms + self.allowed_lateness_ms <= watermark
            if late.any():
                _DROPPED.add(store, int(table.column(P_COUNT).to_numpy()[late].sum()))
                table = table.filter(pa.array(~late))
        n = table.num_rows
        return table.rename_columns([*self.key_columns, KEY_GROUP_COL, WINDOW_START, tables.COUNT, tables.SUM]) \
            .append_column(_FIRED, pa.array(np.zeros(n, dtype=bool))) \
            .append_column(_UPDATED, pa.array(np.ones(n, dtype=bool)))

    def _held(self, store, wanted, touched: set[int], converted: dict[int, pa.Table], watermark: int | None,
              final: bool) -> tuple[list[pa.Table], set[int], set[int]]:
        """The stored windows of the groups that change this epoch (new rows, or a window
        due to fire or to be cleaned up), each with its key group; those groups; and the
        groups of `wanted` that have a stored table."""
        wanted = list(wanted)
        raws = store.get_many([group_prefix(g, _NS_TABLE) for g in wanted])
        held: list[pa.Table] = []
        changing: set[int] = set()
        stored = {g for g, raw in zip(wanted, raws) if raw is not None}
        for g, raw in zip(wanted, raws):
            table = None if raw is None else tables.decode(raw, f"TumblingWindow {self.name!r}, key group {g}")
            if g in converted:
                table = converted[g] if table is None else pa.concat_tables([table, converted[g]])
            if table is None or not table.num_rows:
                if raw is not None:
                    changing.add(g)  # an empty table (never written so): deleted
                continue
            if g not in touched and g not in converted and not self._due(table, watermark, final):
                continue
            changing.add(g)
            n = table.num_rows
            held.append(table.select(self._table_schema.names).cast(self._table_schema)
                        .add_column(len(self.key_columns), KEY_GROUP_COL, pa.array(np.full(n, g, dtype=np.int32)))
                        .append_column(_UPDATED, pa.array(np.zeros(n, dtype=bool))))
        return held, changing, stored

    def _due(self, table: pa.Table, watermark: int | None, final: bool) -> bool:
        if final:
            return True
        if watermark is None:
            return False
        ends = table.column(WINDOW_START).to_numpy() + self.size_ms
        fired = table.column(_FIRED).to_numpy(zero_copy_only=False)
        return bool(((~fired & (ends <= watermark)) | (ends + self.allowed_lateness_ms <= watermark)).any())

    def _write_back(self, store, kept: pa.Table, fired: np.ndarray, changed: list[int], stored: set[int]) -> None:
        """One entry per changed key group: its windows still held, or none when it holds none."""
        kept = kept.set_column(kept.schema.get_field_index(_FIRED), _FIRED, pa.array(fired))
        order = pc.sort_indices(kept, [(KEY_GROUP_COL, "ascending"), (WINDOW_START, "ascending")])
        kept = kept.take(order)
        kgs = kept.column(KEY_GROUP_COL).to_numpy()
        body = kept.select(self._table_schema.names).replace_schema_metadata(self._table_schema.metadata)
        keys, values, gone = [], [], []
        for g in changed:
            lo, hi = np.searchsorted(kgs, g, "left"), np.searchsorted(kgs, g, "right")
            if hi > lo:
                keys.append(group_prefix(g, _NS_TABLE))
                values.append(tables.encode(body.slice(lo, hi - lo)))
            elif g in stored:
                gone.append(group_prefix(g, _NS_TABLE))
        store.put_many(keys, values)
        store.delete_many(gone)

    @property
    def _sum_type(self) -> pa.DataType:
        return pa.float64() if pa.types.is_floating(self.value_type) else pa.int64()

    @property
    def _table_schema(self) -> pa.Schema:
        return tables.table_schema(self.keys.fields(), pa.types.is_floating(self.value_type))

    def _rows(self, windows: pa.Table) -> pa.Table:
        starts = windows.column(WINDOW_START).to_numpy()
        out = self.keys.cast_keys(windows.select(self.key_columns))
        out = out.append_column(WINDOW_START, event_time.arrow_from_ms(starts, self.time_kind)) \
            .append_column(WINDOW_END, event_time.arrow_from_ms(starts + self.size_ms, self.time_kind)) \
            .append_column("count", windows.column(tables.COUNT).cast(pa.int64()))
        if "sum" in self.aggs:
            out = out.append_column("sum", windows.column(tables.SUM).cast(self.value_type))
        return out

    # -- stores written by the per-window layout ----------------------------------------
    def _convert_old_layout(self, store, groups: range) -> dict[int, pa.Table]:
        """On the first epoch of a store written by the per-window layout (one record per
        window under `win`, fire and clean-up indexes): its windows, per key group, in
        the table layout; the old entries are deleted in the same epoch. The store's
        metadata records the layout, so this scan runs once per store."""
        if store.get_meta(tables.LAYOUT_META) == tables.LAYOUT:
            return {}
        if store.get_meta(tables.ENGINE_META) is not None:
            raise ConfigError(f"TumblingWindow {self.name!r}: its state was written by a TumblingWindow with Spark "
                              "SQL aggregates or an output_mode, which keeps its state another way; counting (and "
                              "summing) without an output_mode, it would start from empty windows. Keep the step as "
                              "it was, or give it a new name to start its state from empty")
        store.put_meta(tables.LAYOUT_META, tables.LAYOUT)
        old, records, values = [], [], []
        for key, value in store.scan_range(groups.start.to_bytes(2, "big"), groups.stop.to_bytes(2, "big")):
            ns = key[2:3 + key[2]]
            if ns == _NS_WINDOW:
                records.append(key)
                values.append(value)
                old.append(key)
            elif ns in (_NS_FIRE, _NS_CLEANUP):
                old.append(key)
        store.delete_many(old)
        if not records:
            return {}
        fields = self.keys.fields()
        at = 2 + len(_NS_WINDOW)
        user_keys = pc.binary_slice(pa.array(records, pa.binary()), at, -8)
        columns = decode_fixed_user_keys(user_keys, fields)
        if columns is None:  # string / binary / float keys: one by one
            types = [f.type for f in fields]
            columns = key_columns_from_plain([decode_user_key(k, at, types)[0] for k in records], fields)
        totals = _per_window_codec(self.name, self.value_type).decode_many(values)
        groups_of = np.array([int.from_bytes(k[:2], "big") for k in records], dtype=np.int32)
        table = pa.Table.from_arrays(
            [*columns, pa.array(np.array([decode_timestamp(k[-8:]) for k in records], dtype=np.int64)),
             pa.array(totals["count"], pa.int64()), pa.array(totals["sum"]).cast(self._sum_type),
             pa.array(totals["fired"] == 1)], schema=self._table_schema)
        return {int(g): table.filter(pa.array(groups_of == g)) for g in np.unique(groups_of)}


_SIGNATURE = inspect.signature(TumblingWindow.__init__)


def _per_window_codec(name: str, value_type: pa.DataType) -> FixedWidthCodec:
    """The per-window record of the per-window layout."""
    return FixedWidthCodec(name, [("count", "i8"), ("sum", "f8" if pa.types.is_floating(value_type) else "i8"),
                                  ("fired", "i8")])


def _normalized(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Float keys with -0.0 folded into 0.0: one window, as the stored key bytes made it."""
    if pa.types.is_floating(column.type):
        return pc.add(column, pa.scalar(0.0, column.type))
    return column


def _merged(windows: pa.Table, by: list[str]) -> pa.Table:
    """One row per (key, key group, window_start): totals summed, flags or-ed."""
    grouped = windows.group_by(by, use_threads=False).aggregate(
        [(tables.COUNT, "sum"), (tables.SUM, "sum"), (_FIRED, "any"), (_UPDATED, "any")])
    return grouped.rename_columns({f"{tables.COUNT}_sum": tables.COUNT, f"{tables.SUM}_sum": tables.SUM,
                                   f"{_FIRED}_any": _FIRED, f"{_UPDATED}_any": _UPDATED})
