"""`SlidingWindow`: hopping windows of `size` every `slide`, per key (Spark's
`window(ts, "10 minutes", "1 minute")`, Flink's HOP / SlidingEventTimeWindows).

Windows are [k*slide, k*slide + size) for every integer k; a row at t is in each one
with start <= t < end (size/slide of them when slide divides size). State, output
modes and lateness: see base.py; panes and why state is per window: see panes.py.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from sparkpoint.api.durations import duration_ms
from sparkpoint.api.windows.panes import PaneWindow
from sparkpoint.errors import ConfigError


class SlidingWindow(PaneWindow):
    """Per-key sliding (hopping) event-time windows of `size` starting every `slide`.

    Output: key columns, window_start, window_end, `aggs` (Spark SQL aggregates such as
    "count(DISTINCT user) FILTER (WHERE amount > 10) AS n", docs/aggregates.md; or count, sum,
    min, max, avg of `value_column`), late. `output_mode` "final" emits each window once the watermark
    passes its end (again, marked late, on rows within `allowed_lateness`); "update"
    emits every window an epoch changed."""

    state_namespace = "hop"

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

    def assign(self, panes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        size, slide, pane = self.size_ms, self.slide_ms, self.pane_ms
        first = -((size - pane - panes) // slide)  # ceil((p + pane - size) / slide): the window ends past the pane
        last = panes // slide                       # the last window starting at or before the pane
        n = np.maximum(last - first + 1, 0)
        which = np.repeat(np.arange(len(panes)), n)
        offset = np.arange(len(which)) - np.repeat(np.cumsum(n) - n, n)
        starts = (first[which] + offset) * slide
        return which, starts, starts + size
