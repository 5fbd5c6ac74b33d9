"""`TumblingWindow` with Spark SQL aggregates or an explicit output mode.

A tumbling window is a sliding window whose slide is its size: every row is in exactly
one window, and each pane is one window. So this is the shared window engine
(base.py, panes.py) with the options every window kind takes: any Spark SQL aggregates,
`output_mode="final"` or `"update"`, late re-fires marked in the `late` column.

`sparkpoint.TumblingWindow(...)` builds one of these when it is given `output_mode` or
aggregates other than its original count [, sum] (api/window.py); without them it keeps
its vectorized state of count and sum (one Arrow table per key group) and its own output
(no `late` column), which checkpoints taken before this variant existed hold.
"""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa

from sparkpoint.api.durations import duration_ms
from sparkpoint.api.windows.sliding import SlidingWindow
from sparkpoint.errors import ConfigError
from sparkpoint.state import window_tables as tables
from sparkpoint.state.interfaces import EpochContext
from sparkpoint.state.keys import group_prefix, key_group_range, namespace

_TABLE_STATE = [namespace(n) for n in (tables.TABLE_NS, tables.OLD_RECORD_NS)]


class TumblingWindow(SlidingWindow):
    """Per-key tumbling event-time windows of `size` on the shared window engine.

    Output: key columns, window_start, window_end, `aggs`, late (see SlidingWindow)."""

    state_namespace = "tumble"

    def __init__(self, name: str, key_columns: Sequence[str], time_column: str,
                 size_ms: int | str | None = None, allowed_lateness_ms: int | str = 0,
                 aggs: Sequence[str] = ("count",), value_column: str | None = None, *,
                 size: int | str | None = None, allowed_lateness: int | str | None = None,
                 value_type: str | pa.DataType = "double", key_schema: Any = None, output_mode: str = "final"):
        if (size_ms is None) == (size is None):
            raise ConfigError(f"TumblingWindow {name!r}: give the window size once, as size_ms=60000 "
                              "or size='60 s'")
        window = duration_ms(size_ms if size is None else size, f"TumblingWindow {name!r} size")
        if window <= 0:
            raise ConfigError(f"TumblingWindow {name!r}: size must be > 0 (got {window} ms)")
        lateness = allowed_lateness_ms if allowed_lateness is None else allowed_lateness
        super().__init__(name, key_columns, time_column, window, window, aggs=aggs, value_column=value_column,
                         allowed_lateness=lateness, output_mode=output_mode, value_type=value_type,
                         key_schema=key_schema)

    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        # The same step name with count [, sum] and no output mode keeps its state as
        # tables (api/window.py): read by this engine, it would be empty windows.
        if store.get_meta(tables.ENGINE_META) is None:
            groups = key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism)
            if store.get_meta(tables.LAYOUT_META) is not None or any(
                    store.has_prefix(group_prefix(g, ns)) for g in groups for ns in _TABLE_STATE):
                raise ConfigError(f"TumblingWindow {self.name!r}: its state was written by a TumblingWindow that "
                                  "counts (and sums) without an output_mode; with Spark SQL aggregates or an "
                                  "output_mode it keeps its state another way and would start from empty windows. "
                                  "Keep the step as it was, or give it a new name to start its state from empty")
            store.put_meta(tables.ENGINE_META, tables.ENGINE)
        return super().apply(store, rows, ctx)
