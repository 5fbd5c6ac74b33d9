"""Windows assembled from panes: sliding and cumulate windows.

A pane is the largest slice of time that no window boundary cuts (Flink's pane
optimisation): gcd(size, slide) for sliding windows, the step for cumulate windows.
Each row belongs to exactly one pane, and each pane lies whole in every window it
touches. So Spark pre-aggregates per (key, pane) — the shuffle carries one partial per
key and pane, as for a tumbling window of the pane's size, not one per window a row
belongs to — and the worker spreads each pane's partial over its windows with numpy
and merges them into per-window state.

With the one-column aggregates (count, sum, min, max, avg) a `SlidingWindow` or
`CumulateWindow` keeps the panes themselves, one Arrow table per key group, and
assembles windows from them with numpy when they fire (pane_table_state.py): one state
write per changed key group and epoch, whatever the number of windows. The per-window
engine here (`_merge`, state.py) serves Spark SQL aggregates, whose partials cannot be
summed as plain columns, and stores that held per-window state before pane tables
came: each window is one record (fired with one read, cleaned up by one delete, late
firing and clean-up exactly as for tumbling windows) plus one due-index entry, so
size/slide (or size/step) state updates per pane partial instead of one.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api import event_time
from sparkpoint.api.windows.base import WindowOperator
from sparkpoint.api.windows.state import Windows
from sparkpoint.state.interfaces import KEY_GROUP_COL
from sparkpoint.state.keys import encode_user_keys, plain_key_tuples

P_PANE = "__pane"
_START, _END = "__start", "__end"


class PaneWindow(WindowOperator):
    pane_ms: int

    def assign(self, panes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For pane starts `panes`: (index of the pane, window start, window end), one
        entry per window a pane lies in."""
        raise NotImplementedError

    # -- Spark side -------------------------------------------------------------------
    def pre_aggregate(self, df, carry=()):
        from pyspark.sql import functions as F

        ms = self.event_time_ms(df)
        pane = (ms - F.pmod(ms, F.lit(self.pane_ms))).alias(P_PANE)  # exact floor, also < 0
        pre = df.groupBy(*self.key_columns, pane).agg(*self.aggregates.spark_partials(), *carry)
        self.aggregates.resolve_from_spark(pre.schema)  # SQL aggregates' types, known on the driver
        return pre

    # -- worker side ------------------------------------------------------------------
    def _pane_partials(self, rows: pa.Table) -> pa.Table:
        if P_PANE in rows.column_names:
            panes = rows.column(P_PANE).cast(pa.int64())
        else:  # raw rows
            ms = event_time.arrow_ms(rows.column(self.time_column))
            ms_np = pc.fill_null(ms, 0).to_numpy()
            panes = pa.array(ms_np - np.mod(ms_np, self.pane_ms), mask=pc.is_null(ms).to_numpy(zero_copy_only=False))
        table = rows.select([*self.key_columns, KEY_GROUP_COL]).append_column(P_PANE, panes)
        for name, col in self.aggregates.partial_columns(rows).items():
            table = table.append_column(name, col)
        table = table.filter(pc.is_valid(table.column(P_PANE)))  # no event time: no window
        return self.aggregates.combine(table, [*self.key_columns, KEY_GROUP_COL, P_PANE])

    def _merge(self, store, rows: pa.Table, watermark: int | None) -> pa.Table:
        panes = self._pane_partials(rows)
        which, starts, ends = self.assign(panes.column(P_PANE).to_numpy())
        if watermark is not None:
            open_ = ends + self.allowed_lateness_ms > watermark
            # A row is dropped when every window it belongs to is closed.
            reached = np.bincount(which[open_], minlength=panes.num_rows) > 0
            self.windows.count_dropped(store, panes.column(self.aggregates.count_column).to_numpy()[~reached].sum())
            which, starts, ends = which[open_], starts[open_], ends[open_]
        if not len(which):
            return self.output_schema.empty_table()
        spread = panes.take(pa.array(which)).append_column(_START, pa.array(starts)).append_column(_END, pa.array(ends))
        table = self.aggregates.combine(spread, [*self.key_columns, KEY_GROUP_COL, _END, _START])
        records = self.windows.new_records(table.num_rows)
        records["start"] = table.column(_START).to_numpy()
        records["end"] = table.column(_END).to_numpy()
        parts = self.aggregates.fill(records, table)
        late = np.zeros(len(records), dtype=bool) if watermark is None else records["end"] <= watermark
        records["late"] = late
        w = Windows(table.column(KEY_GROUP_COL).to_pylist(), encode_user_keys(table, self.key_columns),
                    records["end"].copy(), plain_key_tuples(table, self.key_columns), records, parts)
        old, found = self.windows.read(store, w)
        if parts is not None:
            w.parts = self.aggregates.merge_parts(parts, self.windows.read_parts(store, w), self._used_for)
        if found.any():
            at = np.flatnonzero(found)
            merged = records[at]
            self.aggregates.add(merged, old[at])
            # A fired window that gets rows fires again (its end has passed: this epoch).
            merged["fired"] = 0
            records[at] = merged
        self.windows.write(store, w, old, found)
        return self._updated(w, late)
