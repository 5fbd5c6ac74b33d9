"""What every window kind shares: its options, its output schema, and the epoch
(merge the epoch's partials, then fire and clean up what the watermark made due).

Per epoch with watermark W (`ctx.watermark_ms`, the one in effect before the epoch):
  1. merge: the epoch's partials (Spark's, or raw rows in the test harness) are
     assigned to windows and merged into state. A window whose end + allowed lateness
     <= W is closed: its rows are dropped and counted (`dropped_count(store)`).
  2. output, by `output_mode`:
     - "final": each window is emitted once, when W >= its end; a window that gets
       rows after that (late, within the allowed lateness) is emitted again with its
       updated aggregates (Flink's late firing);
     - "update": every window the epoch's rows changed is emitted with its aggregates
       so far, in that epoch; nothing is emitted when the watermark passes.
     The boolean column `late` is True on a row that rows arriving after W passed the
     window's end contributed to: a late re-fire (final), a late update (update).
  3. clean up: a window's state is deleted once its end + allowed lateness <= W,
     exactly when any further row for it would be dropped.
`ctx.final` (end of input) fires every pending window and deletes all state.

Output columns: the key columns, window_start, window_end (the time column's kind:
TIMESTAMP in, TIMESTAMP out; integer ms in, BIGINT ms out), the aggregates in the
order given, then `late`.
"""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa

from sparkpoint.api import event_time
from sparkpoint.api.aggfuncs.stored import check_recorded
from sparkpoint.api.aggregate import KeySchema, require_key_groups
from sparkpoint.api.durations import duration_ms
from sparkpoint.api.windows.aggs import WINDOW_AGGREGATES, WindowAggregates
from sparkpoint.api.windows.state import LATE, OUTPUT_MODES, WINDOW_END, WINDOW_START, Windows, WindowState
from sparkpoint.errors import ConfigError
from sparkpoint.state.interfaces import EpochContext, StatefulOperator
from sparkpoint.state.keys import key_group_range


class WindowOperator(StatefulOperator):
    kind = "window"
    state_namespace = "w"

    def __init__(self, name: str, key_columns: Sequence[str], time_column: str, *, aggs: Sequence[str],
                 value_column: str | None, value_type: str | pa.DataType, allowed_lateness: int | str,
                 output_mode: str, key_schema: Any):
        self.name = name
        what = f"{type(self).__name__} {name!r}"
        self.allowed_lateness_ms = duration_ms(allowed_lateness, f"{what} allowed_lateness")
        if self.allowed_lateness_ms < 0:
            raise ConfigError(f"{what}: allowed_lateness must be >= 0, got {self.allowed_lateness_ms} ms")
        if output_mode not in OUTPUT_MODES:
            raise ConfigError(f"{what}: output_mode must be one of {list(OUTPUT_MODES)}, got {output_mode!r}")
        clash = [c for c in key_columns if c in (WINDOW_START, WINDOW_END, LATE, *WINDOW_AGGREGATES,
                                                  *[a.split()[-1] for a in aggs])]
        if clash:
            raise ConfigError(f"{what}: key column(s) {clash} clash with output columns of the same name; "
                              "rename them first")
        self.key_columns = list(key_columns)
        self.time_column = time_column
        self.output_mode = output_mode
        self.aggregates = WindowAggregates(what, aggs, value_column, value_type)
        self.aggs = self.aggregates.names
        self.value_column = value_column
        self.value_type = self.aggregates.value_type
        self.keys = KeySchema(name, key_columns, key_schema)
        self.windows = WindowState(name, self.keys, self.aggregates, self.allowed_lateness_ms, output_mode,
                                   self.state_namespace)
        # How window bounds are output; set from the input schema on the driver before
        # the operator is shipped, so every worker outputs the same type.
        self.time_kind = event_time.MS

    @property
    def _used_for(self) -> str:
        return f"{type(self).__name__} {self.name!r}"

    def resolve_input_schema(self, schema: pa.Schema) -> None:
        self.keys.resolve(schema)
        self.aggregates.resolve_input_schema(schema)
        if self.time_column in schema.names:  # else: already pre-aggregated (tests)
            self.time_kind = event_time.arrow_kind(schema, self.time_column, self._used_for)

    @property
    def output_schema(self) -> pa.Schema:
        return pa.schema(self.windows.output_fields(self.time_kind))

    def event_time_ms(self, df):
        """The event time of `df`'s rows in epoch ms, as a Spark Column."""
        return event_time.spark_ms(df, self.time_column, self._used_for)

    def dropped_count(self, store) -> int:
        """Rows dropped so far as late beyond the allowed lateness (committed + this epoch)."""
        return WindowState.dropped_count(store)

    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        self.keys.ensure(store, rows)
        if self.aggregates.sql is not None:
            if rows.num_rows:
                self.aggregates.partial_columns(rows.slice(0, 0))  # learn the partial types if not known
            check_recorded(store, self.aggregates.sql, self._used_for)
        emitted: list[pa.Table] = []
        if rows.num_rows:
            require_key_groups(rows, self.name)
            emitted.append(self._merge(store, rows, ctx.watermark_ms))
        watermark = None if ctx.final else ctx.watermark_ms
        if ctx.final or watermark is not None:
            groups = key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism)
            emitted.append(self.windows.rows(self.windows.process_due(store, groups, watermark), self.time_kind))
        out = pa.concat_tables([t for t in emitted if t.num_rows] or [self.output_schema.empty_table()])
        return out.sort_by([(WINDOW_START, "ascending"), (WINDOW_END, "ascending"),
                            *[(k, "ascending") for k in self.key_columns]])

    def _merge(self, store, rows: pa.Table, watermark: int | None) -> pa.Table:
        """Merge the epoch's rows into state; the update-mode rows (empty in final mode)."""
        raise NotImplementedError

    def _updated(self, w: Windows, late: Any) -> pa.Table:
        if self.output_mode == "update":
            return self.windows.rows(w, self.time_kind, late)
        return self.output_schema.empty_table()
