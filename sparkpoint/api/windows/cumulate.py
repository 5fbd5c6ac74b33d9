"""`CumulateWindow`: Flink's CUMULATE windows, per key.

Time is cut into periods of `size` ([k*size, (k+1)*size)); within each period the
windows are [P, P+step), [P, P+2*step), ... [P, P+size): each one extends the previous
by one step, so a dashboard sees the running total of the period at every step. A row
at t is in every window of its period that ends after t. `size` must be a multiple of
`step` (as Flink requires). Output modes and lateness: see base.py; panes (here one
step long): see panes.py. With the one-column aggregates (count, sum, min, max, avg)
the state is one table of panes per key group (pane_table_state.py); with Spark SQL
aggregates, and in a store that held per-window state before that layout, it is per
window (state.py).
"""

from __future__ import annotations

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


class CumulateWindow(PaneWindow):
    """Per-key cumulating event-time windows: within each `size`-aligned period, windows
    from the period's start to every `step` boundary (Flink SQL's CUMULATE).

    Output: key columns, window_start, window_end, `aggs` (Spark SQL aggregates such as
    "count(DISTINCT user) FILTER (WHERE amount > 10) AS n", docs/aggregates.md; or count, sum,
    min, max, avg of `value_column`), late. Output modes and lateness as `SlidingWindow`."""

    state_namespace = "cumulate"
    pane_table_kind = pane_tables.CUMULATE

    def __init__(self, name: str, key_columns: Sequence[str], time_column: str, step: int | str,
                 size: int | str, aggs: Sequence[str] = ("count",), value_column: str | None = None,
                 allowed_lateness: int | str = 0, output_mode: str = "final", *,
                 value_type: str | pa.DataType = "double", key_schema: Any = None):
        what = f"CumulateWindow {name!r}"
        self.step_ms = duration_ms(step, f"{what} step")
        self.size_ms = duration_ms(size, f"{what} size")
        if not 0 < self.step_ms <= self.size_ms or self.size_ms % self.step_ms:
            raise ConfigError(f"{what}: the size must be a positive multiple of the step (as Flink's CUMULATE "
                              f"requires), got step {self.step_ms} ms and size {self.size_ms} ms")
        self.pane_ms = self.step_ms
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
        step, size = self.step_ms, self.size_ms
        period = panes - np.mod(panes, size)
        first = (panes - period) // step + 1  # the first window (in steps) that holds the pane
        n = size // step - first + 1
        which = np.repeat(np.arange(len(panes)), n)
        offset = np.arange(len(which)) - np.repeat(np.cumsum(n) - n, n)
        starts = period[which]
        return which, starts, starts + (first[which] + offset) * step

    # -- the shape, for pane tables (pane_table_state.py) ------------------------------
    def pane_table_shape(self) -> dict[bytes, bytes]:
        return pane_tables.shape_metadata(pane_tables.CUMULATE, self.size_ms, self.step_ms,
                                          self.allowed_lateness_ms, self.output_mode)

    def last_window_end(self, panes: np.ndarray) -> np.ndarray:
        """The end of each pane's period: its last window's end."""
        return panes - np.mod(panes, self.size_ms) + self.size_ms

    def window_ends_in(self, panes: np.ndarray, spans: list[tuple[int, int]]) -> bool:
        """Whether a window holding one of `panes` ends in (since, until] for one of
        `spans`. A pane's windows end at every step boundary from the pane's end to its
        period's end, so per pane the first boundary after `since` is the only candidate."""
        step = self.step_ms
        period_end = self.last_window_end(panes)
        low = int(panes.min())  # keeps a `since` of "never" within int64; below every pane it changes nothing
        for since, until in spans:
            end = np.maximum(panes + step, (max(since, low) // step + 1) * step)
            if ((end <= period_end) & (end <= until)).any():
                return True
        return False

    def window_starts(self, ends: np.ndarray) -> np.ndarray:
        """A period's windows share its start: the period an end falls in (ends are in (P, P + size])."""
        return (ends - 1) // self.size_ms * self.size_ms
