"""The live progress line: epoch, records/s, last checkpoint (id, duration, size),
failed checkpoints, watermark, source lag. One line per interval; on a terminal
it rewrites itself in place."""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any


def _fmt_bytes(n: float | None) -> str:
    if not n:
        return "0B"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}TB"


class ProgressReporter:
    def __init__(self, job: Any, enabled: bool = True, interval_ms: int = 1000, stream=None):
        self.job = job
        self.enabled = enabled
        self.interval_s = interval_ms / 1000
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = 0.0
        self._window: deque[tuple[float, int]] = deque(maxlen=64)
        self.output_rows = 0

    def on_epoch(self, result: Any, output_rows: int, records: int | None = None) -> None:
        """`records`: what the source read (the epoch's input rows unless given)."""
        self._window.append((time.monotonic(), result.input_records if records is None else records))
        self.output_rows += output_rows
        self.maybe_report()

    def rate(self) -> float:
        if len(self._window) < 2:
            return 0.0
        (t0, _), (t1, _) = self._window[0], self._window[-1]
        n = sum(c for _, c in list(self._window)[1:])
        return n / (t1 - t0) if t1 > t0 else 0.0

    def line(self) -> str:
        job = self.job
        stats = job.coordinator.stats.snapshot()
        chk = "none yet"
        if stats.get("last_completed_id") is not None:
            chk = (f"#{stats['last_completed_id']} {(stats.get('last_duration_ms') or 0) / 1000:.2f}s "
                   f"{_fmt_bytes(stats.get('last_size_bytes'))}")
        wm = job._watermark()
        lag = sum(job.source_lag().values())
        records = f"records {job.records:,}"
        if getattr(job, "replayed_records", 0):
            records += f" (+{job.replayed_records:,} replayed)"
        malformed = sum(getattr(src, "malformed_records", 0) for src in job.sources.values())
        if malformed:
            records += f" | malformed {malformed:,}"
        return (f"[{job.job_name}] {job.status.status.value} epoch {job.epoch} | {self.rate():,.0f} rec/s | "
                f"{records} | out {self.output_rows:,} | checkpoint {chk} | "
                f"completed {stats.get('completed', 0)} failed {stats.get('counted_failed', 0)} | "
                f"wm {wm if wm is not None else '-'} | lag {lag:,}")

    def announce(self, text: str) -> None:
        """A line the user must see whatever the log level (e.g. where the run resumed)."""
        if self.tty:
            self.stream.write("\r\x1b[2K")
        self.stream.write(f"[{self.job.job_name}] {text}\n")
        self.stream.flush()

    def maybe_report(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        try:
            text = self.line()
        except Exception as e:  # progress must never break the job
            text = f"[progress unavailable: {e}]"
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.maybe_report(force=True)
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()
