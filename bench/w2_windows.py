"""The window of W2 and of its two variants, as sparkpoint and Spark Structured Streaming
write it, and the number of rows each must emit, computed with numpy from the events.

- `tumbling` (section `w2`): 60 s windows; an event is in one window.
- `sliding` (section `w2-sliding`): 60 s windows starting every 10 s (Spark's
  `window(ts, "60 seconds", "10 seconds")`, Flink's HOP); an event is in 6 windows, so
  there are about 6 times as many (window, key) rows to hold and emit as in `w2`.
- `session` (section `w2-session`): sessions per key with a 30 s gap (Spark's
  `session_window(ts, "30 seconds")`, Flink's SESSION). Why 30 s: at W2's density (5,000
  events per second of event time over 100 k uniform keys) a key gets an event every
  20 s on average, with exponential gaps between its events, so a gap g ends a session
  with probability exp(-g / 20 s). A 10 s gap would leave 1.6 events per session (most
  sessions a single event: hardly sessions); 30 s gives e^1.5 = 4.5 events per session
  (about 1.1 M sessions in 5 M events, each spanning ~1.5 min of event time, so most span
  several epochs of 100 s and merge with stored sessions); 60 s would give 20 events and
  ~2.5 sessions per key, each open for ~7 min. Any other N/K keeps this shape when the
  density per key (event time per second / K) is kept: the smoke run uses
  `--keys 10000 --event-time-per-s 500`.

The expected row counts come from the generator's (key, ts) pairs, collected once and
cached beside the Parquet events: sorted by key and time, per key,
- sliding (and tumbling, slide = size): an event at t is in the windows k with
  k * slide <= t < k * slide + size, an interval of k; the rows are the size of the union
  of those intervals per key;
- session: an event starts a new session when it is the key's first or more than the gap
  after the key's previous event (spans [t, t + gap) that touch are one session, as in
  Spark and Flink).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

WINDOW_MS = 60_000
SLIDE_MS = 10_000
GAP_MS = 30_000
KINDS = ("tumbling", "sliding", "session")


@dataclass(frozen=True)
class Windowing:
    kind: str = "tumbling"
    size_ms: int = WINDOW_MS
    slide_ms: int = SLIDE_MS  # sliding only
    gap_ms: int = GAP_MS  # session only

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown window kind {self.kind!r}; use one of {', '.join(KINDS)}")
        if self.kind == "sliding" and not 0 < self.slide_ms <= self.size_ms:
            raise ValueError(f"a sliding window needs 0 < slide <= size, got {self.slide_ms} and {self.size_ms} ms")
        if self.kind == "session" and self.gap_ms <= 0:
            raise ValueError(f"a session gap must be > 0, got {self.gap_ms} ms")

    @property
    def workload(self) -> str:
        """The name of the workload and of its run_all.py section."""
        return "w2" if self.kind == "tumbling" else f"w2-{self.kind}"

    @property
    def reach_ms(self) -> int:
        """How far past an event the last window holding it ends."""
        return self.gap_ms if self.kind == "session" else self.size_ms

    def fields(self) -> dict:
        """What a RESULT line says about the window."""
        out = {"window": self.kind, "window_ms": self.size_ms if self.kind != "session" else None}
        if self.kind == "sliding":
            out["slide_ms"] = self.slide_ms
        if self.kind == "session":
            out["gap_ms"] = self.gap_ms
        return out

    def sparkpoint_step(self, name: str):
        from sparkpoint import SessionWindow, SlidingWindow, TumblingWindow

        if self.kind == "tumbling":
            return TumblingWindow(name, ["key"], "ts", size=f"{self.size_ms // 1000} s")
        if self.kind == "sliding":
            return SlidingWindow(name, ["key"], "ts", size=f"{self.size_ms // 1000} s",
                                 slide=f"{self.slide_ms // 1000} s")
        return SessionWindow(name, ["key"], "ts", gap=f"{self.gap_ms // 1000} s")

    def spark_column(self, event_time):
        """The grouping column of the Spark SS query, a struct of start and end."""
        from pyspark.sql import functions as F

        if self.kind == "tumbling":
            return F.window(event_time, f"{self.size_ms // 1000} seconds")
        if self.kind == "sliding":
            return F.window(event_time, f"{self.size_ms // 1000} seconds", f"{self.slide_ms // 1000} seconds")
        return F.session_window(event_time, f"{self.gap_ms // 1000} seconds")

    @property
    def tag(self) -> str:
        if self.kind == "sliding":
            return f"sliding-{self.size_ms}-{self.slide_ms}"
        if self.kind == "session":
            return f"session-{self.gap_ms}"
        return f"tumbling-{self.size_ms}"

    def count_rows(self, key: np.ndarray, ts: np.ndarray) -> dict:
        """{output_rows, windows}: the rows a final-mode run over these events emits, and
        the distinct window starts (sessions: None)."""
        order = np.lexsort((ts, key))
        key, ts = key[order], ts[order]
        if self.kind == "session":
            starts = np.ones(len(key), dtype=bool)
            starts[1:] = (key[1:] != key[:-1]) | (ts[1:] - ts[:-1] > self.gap_ms)
            sessions = int(starts.sum())
            return {"output_rows": sessions, "windows": None,
                    "events_per_session": len(key) / sessions if sessions else None}
        slide = self.size_ms if self.kind == "tumbling" else self.slide_ms
        first = (ts - self.size_ms) // slide + 1  # the windows k holding t: first..last
        last = ts // slide
        rows = _union_size(first, last, np.r_[True, key[1:] != key[:-1]] if len(key) else np.ones(0, bool))
        by_time = np.argsort(ts, kind="stable")
        windows = _union_size(first[by_time], last[by_time], np.arange(len(ts)) == 0)
        return {"output_rows": rows, "windows": windows}


def _union_size(first: np.ndarray, last: np.ndarray, new_group: np.ndarray) -> int:
    """Sum over groups of |union of the integer intervals [first_i, last_i]|, for rows
    sorted by group and then by `last` (both bounds grow with t, so within a group every
    value of interval i up to the previous `last` is already covered)."""
    if not len(first):
        return 0
    prev_last = np.empty_like(last)
    prev_last[0] = 0
    prev_last[1:] = last[:-1]
    low = np.where(new_group, first, np.maximum(first, prev_last + 1))
    return int(np.maximum(last - low + 1, 0).sum())


def expected_rows(w2, windowing: Windowing, root: str, events) -> dict:
    """{output_rows, windows, max_ts, min_ts, ...} of `windowing` over the events of the
    DataFrame `events` (key, ts), cached under `root` per workload and window."""
    path = os.path.join(root, f"{w2.tag}-{windowing.tag}-expected.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    table = events.select("key", "ts").toArrow()
    key = table.column("key").to_numpy()
    ts = table.column("ts").to_numpy()
    out = windowing.count_rows(key, ts)
    out.update(max_ts=int(ts.max()), min_ts=int(ts.min()))
    os.makedirs(root, exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f)
    return out


def add_arguments(parser) -> None:
    parser.add_argument("--window", choices=KINDS, default="tumbling",
                        help="tumbling (W2), sliding (60 s every --slide-s) or session (gap --gap-s)")
    parser.add_argument("--slide-s", type=int, default=SLIDE_MS // 1000)
    parser.add_argument("--gap-s", type=int, default=GAP_MS // 1000)


def from_args(args) -> Windowing:
    return Windowing(args.window, WINDOW_MS, args.slide_s * 1000, args.gap_s * 1000)
