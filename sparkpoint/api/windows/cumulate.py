"""`CumulateWindow`: Flink's CUMULATE windows, per key.

Time is cut into periods of `size` ([k*size, (k+1)*size)); within each period the
windows are [P, P+step), [P, P+2*step), ... [P, P+size): each one extends the previous
by one step, so a dashboard sees the running total of the period at every step. A row
at t is in every window of its period that ends after t. `size` must be a multiple of
`step` (as Flink requires). State, output modes and lateness: see base.py; panes (here
one step long) and why state is per window: see panes.py.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from sparkpoint.api.durations import duration_ms
from sparkpoint.api.windows.panes import PaneWindow
from sparkpoint.errors import ConfigError


class CumulateWindow(PaneWindow):
    """Per-key cumulating event-time windows: within each `size`-aligned period, windows
    from the period's start to every `step` boundary (Flink SQL's CUMULATE).

    Output: key columns, window_start, window_end, `aggs` (Spark SQL aggregates such as
    "count(DISTINCT user) FILTER (WHERE amount > 10) AS n", docs/aggregates.md; or count, sum,
    min, max, avg of `value_column`), late. Output modes and lateness as `SlidingWindow`."""

    state_namespace = "cumulate"

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

    def assign(self, panes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        step, size = self.step_ms, self.size_ms
        period = panes - np.mod(panes, size)
        first = (panes - period) // step + 1  # the first window (in steps) that holds the pane
        n = size // step - first + 1
        which = np.repeat(np.arange(len(panes)), n)
        offset = np.arange(len(which)) - np.repeat(np.cumsum(n) - n, n)
        starts = period[which]
        return which, starts, starts + (first[which] + offset) * step
