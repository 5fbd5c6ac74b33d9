"""`SlidingWindow`: hopping windows of `size` every `slide`, per key (Spark's
`window(ts, "10 minutes", "1 minute")`, Flink's HOP / SlidingEventTimeWindows).

Windows are [k*slide, k*slide + size) for every integer k; a row at t is in each one
with start <= t < end (size/slide of them when slide divides size). State, output
modes and lateness: see base.py; panes: see panes.py. With the one-column aggregates
(count, sum, min, max, avg) the state is one table of panes per key group
(pane_table_state.py); with Spark SQL aggregates, and in a store that held per-window
state before that layout, it is per window (state.py).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from sparkpoint.api.durations import duration_ms
from sparkpoint.api.windows.pane_table_state import PaneTables
from sparkpoint.api.windows.panes import PaneWindow
from sparkpoint.errors import ConfigError
from sparkpoint.state import pane_tables
from sparkpoint.state.interfaces import EpochContext
from sparkpoint.state.keys import key_group_range


class SlidingWindow(PaneWindow):
    """Per-key sliding (hopping) event-time windows of `size` starting every `slide`.

    Output: key columns, window_start, window_end, `aggs` (Spark SQL aggregates such as
    "count(DISTINCT user) FILTER (WHERE amount > 10) AS n", docs/aggregates.md; or count, sum,
    min, max, avg of `value_column`), late. `output_mode` "final" emits each window once the watermark
    passes its end (again, marked late, on rows within `allowed_lateness`); "update"
    emits every window an epoch changed."""

    state_namespace = "hop"
    pane_table_kind = pane_tables.SLIDING

    def __init__(self, name: str, key_columns: Sequence[str], time_column: str, size: int | str,
                 slide: int | str, aggs: Sequence[str] = ("count",), value_column: str | None = None,
                 allowed_lateness: int | str = 0, output_mode: str = "final", *,
                 value_type: str | pa.DataType = "double", key_schema: Any = None):
        what = f"SlidingWindow {name!r}"
        self.size_ms = duration_ms(size, f"{what} size")
        self.slide_ms = duration_ms(slide, f"{what} slide")
        if not 0 < self.slide_ms <= self.size_ms:
            raise ConfigError(f"{what}: need 0 < slide <= size (as Spark's window() does), got size "
                              f"{self.size_ms} ms and slide {self.slide_ms} ms")
        self.pane_ms = math.gcd(self.size_ms, self.slide_ms)
        super().__init__(name, key_columns, time_column, aggs=aggs, value_column=value_column,
                         value_type=value_type, allowed_lateness=allowed_lateness, output_mode=output_mode,
                         key_schema=key_schema)

    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        if self.aggregates.sql is None:
            self.keys.ensure(store, rows)
            groups = key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism)
            if PaneTables.uses_tables(self, store, groups):
                return PaneTables(self).apply(store, rows, ctx)
        return super().apply(store, rows, ctx)

    def assign(self, panes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        size, slide, pane = self.size_ms, self.slide_ms, self.pane_ms
        first = -((size - pane - panes) // slide)  # ceil((p + pane - size) / slide): the window ends past the pane
        last = panes // slide                       # the last window starting at or before the pane
        n = np.maximum(last - first + 1, 0)
        which = np.repeat(np.arange(len(panes)), n)
        offset = np.arange(len(which)) - np.repeat(np.cumsum(n) - n, n)
        starts = (first[which] + offset) * slide
        return which, starts, starts + size

    # -- the shape, for pane tables (pane_table_state.py) ------------------------------
    def pane_table_shape(self) -> dict[bytes, bytes]:
        return pane_tables.shape_metadata(pane_tables.SLIDING, self.size_ms, self.slide_ms,
                                          self.allowed_lateness_ms, self.output_mode)

    def last_window_end(self, panes: np.ndarray) -> np.ndarray:
        """The end of the last window holding each pane."""
        return panes // self.slide_ms * self.slide_ms + self.size_ms

    def window_ends_in(self, panes: np.ndarray, spans: list[tuple[int, int]]) -> bool:
        """Whether a window holding one of `panes` ends in (since, until] for one of
        `spans`, without listing the windows: per pane, the first window k*slide that
        ends after `since` is the only candidate."""
        size, slide = self.size_ms, self.slide_ms
        first = -((size - self.pane_ms - panes) // slide)
        last = panes // slide
        low = int(first.min())  # keeps a `since` of "never" within int64
        for since, until in spans:
            k = np.maximum(first, max((since - size) // slide + 1, low))
            if ((k <= last) & (k * slide + size <= until)).any():
                return True
        return False

    def window_starts(self, ends: np.ndarray) -> np.ndarray:
        return ends - self.size_ms
