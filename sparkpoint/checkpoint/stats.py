"""Checkpoint statistics: observes the coordinator, never influences it.

`snapshot()` feeds the progress line and the REST/UI; the same numbers are exported
as Prometheus metrics on the registry given (a fresh one by default, so two
coordinators in one process, or in one test run, never collide).
"""

from __future__ import annotations

import math
import threading
from collections import Counter as _Tally
from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sparkpoint.checkpoint.reasons import CheckpointFailureReason

# Durations kept for percentiles: enough for a day of one-minute checkpoints.
_DURATION_WINDOW = 1440
_DURATION_BUCKETS_S = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


def _percentile(sorted_values: list[int], q: float) -> int | None:
    if not sorted_values:
        return None
    # nearest-rank: the smallest value with at least q of the values at or below it
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


# Started checkpoints that ended without completing, but not because anything is wrong:
# the coordinator stopped (clean end of a bounded run, failover, cancel) or a newer
# checkpoint completed first. Shown as "aborted", never as "failed" (issue 9 #3).
_NOT_A_FAILURE = frozenset({CheckpointFailureReason.COORDINATOR_SHUTDOWN,
                            CheckpointFailureReason.COORDINATOR_SUSPENDING,
                            CheckpointFailureReason.SUBSUMED})


def _is_counted(reason_name: str) -> bool:
    from sparkpoint.checkpoint.reasons import CheckpointFailureReason

    try:
        return CheckpointFailureReason[reason_name].counted
    except KeyError:
        return True


class CheckpointStatsTracker:
    def __init__(self, job_name: str, registry: CollectorRegistry | None = None) -> None:
        self.job_name = job_name
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lock = threading.Lock()
        self._triggered = 0
        self._completed = 0
        self._failed = 0  # started (or counted) checkpoints that failed
        self._aborted = 0  # started checkpoints ended by a stop or a newer completion
        self._declined = 0  # "not now" refusals before an id was assigned
        self._failed_by_reason: _Tally[str] = _Tally()
        self._in_progress: set[int] = set()
        self._durations_ms: deque[int] = deque(maxlen=_DURATION_WINDOW)
        self._last_completed: dict[str, Any] | None = None
        self._last_failed: dict[str, Any] | None = None

        labels = ["job"]
        self._m_triggered = Counter("sparkpoint_checkpoints_triggered",
                                    "Checkpoints started", labels, registry=self.registry)
        self._m_completed = Counter("sparkpoint_checkpoints_completed",
                                    "Checkpoints completed", labels, registry=self.registry)
        self._m_failed = Counter("sparkpoint_checkpoint_failures",
                                 "Checkpoints failed or refused, by reason", labels + ["reason"],
                                 registry=self.registry)
        self._m_in_progress = Gauge("sparkpoint_checkpoints_in_progress",
                                    "Checkpoints in flight", labels, registry=self.registry)
        self._m_last_id = Gauge("sparkpoint_checkpoint_last_completed_id",
                                "Id of the latest completed checkpoint", labels, registry=self.registry)
        self._m_last_duration = Gauge("sparkpoint_checkpoint_last_duration_seconds",
                                      "Duration of the latest completed checkpoint", labels,
                                      registry=self.registry)
        self._m_last_size = Gauge("sparkpoint_checkpoint_last_size_bytes",
                                  "Bytes written by the latest completed checkpoint", labels,
                                  registry=self.registry)
        self._m_duration = Histogram("sparkpoint_checkpoint_duration_seconds",
                                     "Trigger-to-completion time of completed checkpoints", labels,
                                     buckets=_DURATION_BUCKETS_S, registry=self.registry)

    def report_triggered(self, checkpoint_id: int) -> None:
        with self._lock:
            self._triggered += 1
            self._in_progress.add(checkpoint_id)
            in_progress = len(self._in_progress)
        self._m_triggered.labels(self.job_name).inc()
        self._m_in_progress.labels(self.job_name).set(in_progress)

    def report_completed(self, checkpoint_id: int, duration_ms: int, size_bytes: int,
                         completed_at_ms: int) -> None:
        with self._lock:
            self._completed += 1
            self._in_progress.discard(checkpoint_id)
            in_progress = len(self._in_progress)
            self._durations_ms.append(duration_ms)
            self._last_completed = {"id": checkpoint_id, "duration_ms": duration_ms,
                                    "size_bytes": size_bytes, "completed_at_ms": completed_at_ms}
        self._m_completed.labels(self.job_name).inc()
        self._m_in_progress.labels(self.job_name).set(in_progress)
        self._m_last_id.labels(self.job_name).set(checkpoint_id)
        self._m_last_duration.labels(self.job_name).set(duration_ms / 1000)
        self._m_last_size.labels(self.job_name).set(size_bytes)
        self._m_duration.labels(self.job_name).observe(duration_ms / 1000)

    def report_failed(self, checkpoint_id: int | None, reason: CheckpointFailureReason,
                      failed_at_ms: int) -> None:
        with self._lock:
            self._failed_by_reason[reason.name] += 1
            if checkpoint_id is not None and reason in _NOT_A_FAILURE:
                self._aborted += 1
            elif checkpoint_id is not None or reason.counted:
                self._failed += 1
            else:
                self._declined += 1
            if checkpoint_id is not None:
                self._in_progress.discard(checkpoint_id)
                self._last_failed = {"id": checkpoint_id, "reason": reason.name,
                                     "failed_at_ms": failed_at_ms}
            in_progress = len(self._in_progress)
        self._m_failed.labels(self.job_name, reason.name).inc()
        self._m_in_progress.labels(self.job_name).set(in_progress)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            durations = sorted(self._durations_ms)
            last = self._last_completed or {}
            return {
                "triggered": self._triggered,
                "completed": self._completed,
                # Started checkpoints that failed; not those in "aborted".
                "failed": self._failed,
                "aborted": self._aborted,
                "declined": self._declined,
                "failures_by_reason": dict(self._failed_by_reason),
                # What a person calls "failed": reasons that count toward the tolerance
                # (not "scheduler stopped at shutdown" and other not-now outcomes).
                "counted_failed": sum(n for name, n in self._failed_by_reason.items()
                                      if _is_counted(name)),
                "in_progress": len(self._in_progress),
                "last_completed_id": last.get("id"),
                "last_duration_ms": last.get("duration_ms"),
                "last_size_bytes": last.get("size_bytes"),
                "last_completed_at_ms": last.get("completed_at_ms"),
                "last_failed": dict(self._last_failed) if self._last_failed else None,
                "duration_p50_ms": _percentile(durations, 0.50),
                "duration_p99_ms": _percentile(durations, 0.99),
            }
