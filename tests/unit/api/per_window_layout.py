"""The `TumblingWindow` of the per-window state layout, as it was before the table layout
(kept only to write stores in the old layout for the tests that restore them).

`TumblingWindow`: per-key event-time tumbling windows with Flink's lateness rules.

Per epoch with watermark W (`ctx.watermark_ms`):
  1. merge: Spark pre-aggregates each epoch to one partial per (key, window_start);
     a partial whose window_end + allowed_lateness <= W is late beyond lateness: it is
     dropped and counted (`dropped_count(store)`); the others are merged into state.
  2. fire: every window not yet fired with window_end <= W is emitted once; a window
     that already fired and was updated in step 1 (late within lateness) is emitted
     again with its updated totals (Flink's late firing).
  3. clean up: a window's state is deleted once window_end + allowed_lateness <= W —
     exactly when any further partial for it would be dropped. A window due for
     clean-up when it fires (always so without lateness, Flink's default) is deleted
     by the fire step itself, and without lateness no clean-up timer is written: per
     window that is 4 state writes instead of 7 (W2's epochs were bound by them).
`ctx.final` fires and cleans up every window. Firing and clean-up are range scans over
timer indexes keyed by time (per key group), never full scans.

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

from typing import Any, Sequence

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api import event_time
from sparkpoint.api.aggregate import KeySchema, parse_value_type, require_key_groups
from sparkpoint.api.durations import duration_ms
from sparkpoint.errors import ConfigError
from sparkpoint.state.codec import FixedWidthCodec
from sparkpoint.state.interfaces import KEY_GROUP_COL, EpochContext, StatefulOperator
from sparkpoint.state.keys import (decode_fixed_user_keys, decodes_column_wise, encode_state_keys, encode_timestamp,
                                   group_prefix, key_columns_from_plain, key_group_range, namespace,
                                   plain_key_tuples)
from sparkpoint.state.stored import StoredCounter

WINDOW_START = "window_start"
WINDOW_END = "window_end"
P_COUNT, P_SUM = "__count", "__sum"
_NS_WINDOW = namespace("win")
_NS_FIRE = namespace("win-fire")
_NS_CLEANUP = namespace("win-cleanup")
_DROPPED = StoredCounter("dropped")
_TO_END = 1 << 30  # binary_slice's stop for "to the end" (stop=None fails in pyarrow 21)


class TumblingWindow(StatefulOperator):
    def __init__(self, name: str, key_columns: Sequence[str], time_column: str,
                 size_ms: int | str | None = None, allowed_lateness_ms: int | str = 0,
                 aggs: Sequence[str] = ("count",), value_column: str | None = None, *,
                 size: int | str | None = None, allowed_lateness: int | str | None = None,
                 value_type: str | pa.DataType = "double", key_schema: Any = None):
        if (size_ms is None) == (size is None):
            raise ConfigError(f"TumblingWindow {name!r}: give the window size once, as size_ms=60000 "
                              "or size='60 s'")
        self.size_ms = duration_ms(size_ms if size is None else size, f"TumblingWindow {name!r} size")
        self.allowed_lateness_ms = duration_ms(allowed_lateness_ms if allowed_lateness is None
                                                else allowed_lateness, f"TumblingWindow {name!r} lateness")
        if self.size_ms <= 0 or self.allowed_lateness_ms < 0:
            raise ConfigError(f"TumblingWindow {name!r}: size must be > 0 and allowed lateness >= 0 "
                              f"(got {self.size_ms} ms, {self.allowed_lateness_ms} ms)")
        if tuple(aggs) not in (("count",), ("count", "sum")):
            raise ConfigError(f"TumblingWindow {name!r}: aggs must be ('count',) or ('count', 'sum'), "
                              f"got {tuple(aggs)}; for other aggregates (any Spark SQL aggregate) use "
                              "SlidingWindow with slide equal to size")
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
        kind = "f8" if pa.types.is_floating(self.value_type) else "i8"
        self._codec = FixedWidthCodec(name, [("count", "i8"), ("sum", kind), ("fired", "i8")])
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
        watermark = None if ctx.final else ctx.watermark_ms
        emitted: list[pa.Table] = []
        if rows.num_rows:
            require_key_groups(rows, self.name)
            emitted.append(self._merge(store, self._partials(rows), ctx.watermark_ms))
        groups = key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism)
        if ctx.final or watermark is not None:
            emitted.append(self._fire(store, groups, watermark))
            self._clean_up(store, groups, watermark)
        out = pa.concat_tables([t for t in emitted if t.num_rows] or [self.output_schema.empty_table()])
        return out.sort_by([(WINDOW_START, "ascending"), *[(k, "ascending") for k in self.key_columns]])

    def _partials(self, rows: pa.Table) -> pa.Table:
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
            sums = pa.array(np.zeros(rows.num_rows), type=self.value_type)
        table = rows.select([*self.key_columns, KEY_GROUP_COL]).append_column(WINDOW_START, starts) \
            .append_column(P_COUNT, counts).append_column(P_SUM, pc.fill_null(sums.cast(self.value_type), 0))
        # Rows without an event time belong to no window.
        table = table.filter(pc.is_valid(table.column(WINDOW_START)))
        grouped = table.group_by([*self.key_columns, KEY_GROUP_COL, WINDOW_START], use_threads=False) \
            .aggregate([(P_COUNT, "sum"), (P_SUM, "sum")])
        return grouped.rename_columns({f"{P_COUNT}_sum": P_COUNT, f"{P_SUM}_sum": P_SUM})

    def _merge(self, store, partials: pa.Table, watermark: int | None) -> pa.Table:
        """Merge partials into window state; return the re-fired (late-updated) windows."""
        starts = partials.column(WINDOW_START).to_numpy()
        ends = starts + self.size_ms
        if watermark is not None:
            late = ends + self.allowed_lateness_ms <= watermark
            if late.any():
                dropped = int(partials.column(P_COUNT).to_numpy()[late].sum())
                _DROPPED.add(store, dropped)
                partials = partials.filter(pa.array(~late))
                starts, ends = starts[~late], ends[~late]
        if partials.num_rows == 0:
            return self.output_schema.empty_table()
        keys = encode_state_keys(partials, self.key_columns, KEY_GROUP_COL, _NS_WINDOW, WINDOW_START)
        stored = self._stored_windows(store, partials, keys)
        totals = np.zeros(partials.num_rows, dtype=self._codec.dtype)
        totals["count"] = partials.column(P_COUNT).to_numpy()
        totals["sum"] = partials.column(P_SUM).to_numpy()
        found = np.fromiter((v is not None for v in stored), dtype=bool, count=len(stored))
        if found.any():
            idx = np.flatnonzero(found)
            old = self._codec.decode_many([v for v in stored if v is not None])
            totals["count"][idx] += old["count"]
            totals["sum"][idx] += old["sum"]
            totals["fired"][idx] = old["fired"]
        store.put_many(keys, self._codec.encode_many(totals))
        self._index_new_windows(store, partials, keys, ends, ~found)
        refired = np.flatnonzero(totals["fired"] == 1)
        return self._rows(partials.select(self.key_columns).take(refired), starts[refired], totals[refired])

    # Scan a key group's windows instead of getting each partial's window when the
    # partials are at least this fraction of the store's entries.
    scan_fraction = 1 / 8

    def _stored_windows(self, store, partials: pa.Table, keys: list[bytes]) -> list[bytes | None]:
        """The stored totals of each partial's window (None: a new window). Most partials
        of an epoch are new windows, and a point get of an absent key probes the memtable
        and each level's bloom filter (W2: ~25% of a subtask's time); the live windows of
        a key group are few, and one scan of them costs ~0.3 us per entry."""
        if len(keys) < self.scan_fraction * store.estimated_entries():
            return store.get_many(keys)
        known: dict[bytes, bytes] = {}
        for g in pc.unique(partials.column(KEY_GROUP_COL)).to_pylist():
            known.update(store.read_prefix(group_prefix(g, _NS_WINDOW)))
        return [known.get(k) for k in keys]

    def _index_new_windows(self, store, partials: pa.Table, keys: list[bytes], ends: np.ndarray,
                           new: np.ndarray) -> None:
        idx = np.flatnonzero(new)
        if not len(idx):
            return
        # <group><win><user key><start> -> <group><win-fire><end><user key> (and win-cleanup,
        # at end + lateness), built column-wise: an epoch indexes ~100k new windows.
        state_keys = pa.array([keys[i] for i in idx], pa.binary())
        group = pc.binary_slice(state_keys, 0, 2)
        user_key = pc.binary_slice(state_keys, 2 + len(_NS_WINDOW), -8)
        if decodes_column_wise(self.keys.fields()):
            values = [b""] * len(idx)  # the fire step reads the key values off the index key
        else:
            values = [msgpack.packb(list(kt), use_bin_type=True)
                      for kt in plain_key_tuples(partials.take(idx), self.key_columns)]
        store.put_many(_timer_keys(group, _NS_FIRE, ends[idx], user_key), values)
        if self.allowed_lateness_ms:  # else the fire step deletes the window (see _fire)
            store.put_many(_timer_keys(group, _NS_CLEANUP, ends[idx] + self.allowed_lateness_ms, user_key),
                           [b""] * len(idx))

    def _fire(self, store, groups: range, watermark: int | None) -> pa.Table:
        """Emit (once) every unfired window with end <= watermark (all when None)."""
        found: list[tuple[bytes, bytes]] = []
        for g in groups:
            prefix = group_prefix(g, _NS_FIRE)
            stop = None if watermark is None else prefix + encode_timestamp(watermark + 1)
            found.extend(store.scan_range(prefix, stop) if stop else store.scan_prefix(prefix))
        if not found:
            return self.output_schema.empty_table()
        index_keys = [k for k, _ in found]
        fire_keys = pa.array(index_keys, pa.binary())
        at = 2 + len(_NS_FIRE)
        starts = _timestamps(pc.binary_slice(fire_keys, at, at + 8)) - self.size_ms
        state_keys = _join_binary(pc.binary_slice(fire_keys, 0, 2), _NS_WINDOW, pc.binary_slice(fire_keys, at + 8, _TO_END),
                                  _timestamp_bytes(starts))
        columns = decode_fixed_user_keys(pc.binary_slice(fire_keys, at + 8, _TO_END), self.keys.fields())
        if columns is None:  # string / binary / float keys: the index value holds them
            columns = key_columns_from_plain([msgpack.unpackb(v, raw=False) for _, v in found], self.keys.fields())
        totals = self._codec.decode_many(store.get_many(state_keys)).copy()
        store.delete_many(index_keys)
        # A window due for clean-up now (end + lateness <= watermark) can get no more
        # rows: it is deleted instead of marked fired. Its clean-up timer, if it has one
        # (written with lateness, or by an older version), is left to _clean_up, which
        # deletes timer and (already deleted) window together.
        due = (np.ones(len(starts), dtype=bool) if watermark is None
               else starts + self.size_ms + self.allowed_lateness_ms <= watermark)
        store.delete_many([state_keys[i] for i in np.flatnonzero(due)])
        kept = np.flatnonzero(~due)
        if len(kept):
            marked = totals[kept].copy()
            marked["fired"] = 1
            store.put_many([state_keys[i] for i in kept], self._codec.encode_many(marked))
        return self._rows(pa.table(columns, names=self.key_columns), starts, totals)

    def _clean_up(self, store, groups: range, watermark: int | None) -> None:
        """Delete windows whose end + lateness <= watermark (all when None)."""
        doomed: list[bytes] = []
        for g in groups:
            prefix = group_prefix(g, _NS_CLEANUP)
            window_prefix = group_prefix(g, _NS_WINDOW)
            stop = None if watermark is None else prefix + encode_timestamp(watermark + 1)
            for key, _ in list(store.scan_range(prefix, stop) if stop else store.scan_prefix(prefix)):
                due = int.from_bytes(key[len(prefix):len(prefix) + 8], "big") - (1 << 63)
                start = due - self.allowed_lateness_ms - self.size_ms
                doomed.append(window_prefix + key[len(prefix) + 8:] + encode_timestamp(start))
                doomed.append(key)
        # Deleted after all scans: a write between two scans makes the next scan merge
        # (and sort) the epoch's writes again; the scans cover other keys than these.
        store.delete_many(doomed)

    def _rows(self, keys: pa.Table, starts: np.ndarray, totals: np.ndarray) -> pa.Table:
        out = self.keys.cast_keys(keys)
        out = out.append_column(WINDOW_START, event_time.arrow_from_ms(starts, self.time_kind)) \
            .append_column(WINDOW_END, event_time.arrow_from_ms(starts + self.size_ms, self.time_kind)) \
            .append_column("count", pa.array(totals["count"], type=pa.int64()))
        if "sum" in self.aggs:
            out = out.append_column("sum", pa.array(totals["sum"], type=self.value_type))
        return out


# -- column-wise key building (keys.py's layout) ----------------------------------------
def _timestamps(eight_bytes: pa.Array) -> np.ndarray:
    """Decode `encode_timestamp` values, one 8-byte binary per row."""
    fixed = eight_bytes.cast(pa.binary(8))
    raw = np.frombuffer(fixed.buffers()[1], dtype=">u8", count=len(fixed), offset=fixed.offset * 8)
    return (raw ^ np.uint64(1 << 63)).astype(np.int64)


def _timestamp_bytes(ts: np.ndarray) -> pa.Array:
    raw = (ts.astype(np.int64).view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8").tobytes()
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), len(ts), [None, pa.py_buffer(raw)]).cast(pa.binary())


def _join_binary(*parts: pa.Array | bytes) -> list[bytes]:
    joined = pc.binary_join_element_wise(*[pa.scalar(p, pa.binary()) if isinstance(p, bytes) else p for p in parts],
                                         pa.scalar(b"", pa.binary()))
    return joined.to_numpy(zero_copy_only=False).tolist()


def _timer_keys(group: pa.Array, ns: bytes, at: np.ndarray, user_key: pa.Array) -> list[bytes]:
    """<group><ns><at><user key> per row."""
    return _join_binary(group, ns, _timestamp_bytes(at), user_key)
