"""Checkpoint statistics: observes the coordinator, never influences it.

`snapshot()` feeds the progress line; `history()`, `details(id)` and `summary()` the
REST API and the dashboard. The same numbers are exported as Prometheus metrics on
the registry given (a fresh one by default, so two coordinators in one process, or
in one test run, never collide).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter as _Tally
from collections import OrderedDict, deque
from typing import Any, Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sparkpoint.checkpoint.reasons import CheckpointFailureReason, RestoreRefusal

# Durations kept for percentiles: enough for a day of one-minute checkpoints.
_DURATION_WINDOW = 1440
_DURATION_BUCKETS_S = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
_SIZE_BUCKETS_B = (1 << 10, 16 << 10, 256 << 10, 1 << 20, 16 << 20, 128 << 20, 1 << 30, 8 << 30)
# Checkpoints kept for the history of the REST API and the dashboard (Flink keeps 10).
_HISTORY_SIZE = 100


def _percentile(sorted_values: list[int], q: float) -> int | None:
    if not sorted_values:
        return None
    # nearest-rank: the smallest value with at least q of the values at or below it
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


# Started checkpoints that ended without completing, but not because anything is wrong:
# the coordinator stopped (clean end of a bounded run, failover, cancel) or a newer
# checkpoint completed first. Shown as "aborted", never as "failed" (an operator
# would otherwise chase failures that never happened).
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
    def __init__(self, job_name: str, registry: CollectorRegistry | None = None,
                 history_size: int = _HISTORY_SIZE, clock: Callable[[], float] = time.time) -> None:
        self.job_name = job_name
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clock = clock
        self._lock = threading.Lock()
        self._triggered = 0
        self._completed = 0
        self._failed = 0  # started (or counted) checkpoints that failed
        self._aborted = 0  # started checkpoints ended by a stop or a newer completion
        self._declined = 0  # "not now" refusals before an id was assigned
        self._restored = 0
        self._commit_failures = 0  # commits of completed checkpoints that failed
        self._consecutive_commit_failures = 0
        self._failed_by_reason: _Tally[str] = _Tally()
        self._restore_refusals: _Tally[str] = _Tally()
        self._in_progress: set[int] = set()
        self._durations_ms: deque[int] = deque(maxlen=_DURATION_WINDOW)
        self._sizes: deque[int] = deque(maxlen=_DURATION_WINDOW)
        self._sync_ms: deque[int] = deque(maxlen=_DURATION_WINDOW)
        self._async_ms: deque[int] = deque(maxlen=_DURATION_WINDOW)
        self._last_completed: dict[str, Any] | None = None
        self._last_failed: dict[str, Any] | None = None
        self._last_restored: dict[str, Any] | None = None
        # id -> one checkpoint's record for the REST API and the dashboard, oldest first.
        self._history: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._history_size = history_size

        # Not `job`: Prometheus sets that label to the scrape job's name (Flink's reporter
        # says job_name for the same reason).
        labels = ["job_name"]
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
        self._m_size = Histogram("sparkpoint_checkpoint_size_bytes",
                                 "Bytes each completed checkpoint added to checkpoint storage", labels,
                                 buckets=_SIZE_BUCKETS_B, registry=self.registry)
        self._m_part = Histogram("sparkpoint_checkpoint_part_duration_seconds",
                                 "Synchronous and asynchronous parts of completed checkpoints (slowest "
                                 "participant)", labels + ["part"], buckets=_DURATION_BUCKETS_S,
                                 registry=self.registry)
        self._m_restored = Counter("sparkpoint_checkpoint_restores",
                                   "Times the job restored from a completed checkpoint", labels,
                                   registry=self.registry)
        self._m_refused = Counter("sparkpoint_restore_refusals",
                                  "Restores refused before anything ran, by reason", labels + ["reason"],
                                  registry=self.registry)
        self._m_commit_failed = Counter("sparkpoint_checkpoint_commit_failures",
                                        "Commits of completed checkpoints (publishing sink output) that failed",
                                        labels, registry=self.registry)
        self._m_commit_streak = Gauge("sparkpoint_checkpoint_commit_consecutive_failures",
                                      "Commits of completed checkpoints that failed since the last one that "
                                      "succeeded", labels, registry=self.registry)
        # Present from the start, so a dashboard shows 0 rather than "no data".
        for m in (self._m_triggered, self._m_completed, self._m_in_progress, self._m_restored,
                  self._m_commit_failed, self._m_commit_streak):
            m.labels(self.job_name)

    # ------------------------------------------------------------------ reports
    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _entry(self, checkpoint_id: int) -> dict[str, Any]:
        """Under the lock. The history record of `checkpoint_id`, created if needed."""
        entry = self._history.get(checkpoint_id)
        if entry is None:
            entry = self._history[checkpoint_id] = {
                "id": checkpoint_id, "status": "IN_PROGRESS", "trigger_timestamp": None,
                "latest_ack_timestamp": None, "end_to_end_duration": None, "state_size": None,
                "sync_duration": None, "async_duration": None, "failure_reason": None,
                "failure_timestamp": None, "participants": {}}
            while len(self._history) > self._history_size:
                self._history.popitem(last=False)
        return entry

    def report_triggered(self, checkpoint_id: int, trigger_timestamp_ms: int | None = None) -> None:
        with self._lock:
            self._triggered += 1
            self._in_progress.add(checkpoint_id)
            in_progress = len(self._in_progress)
            entry = self._entry(checkpoint_id)
            entry["trigger_timestamp"] = trigger_timestamp_ms if trigger_timestamp_ms is not None \
                else self._now_ms()
        self._m_triggered.labels(self.job_name).inc()
        self._m_in_progress.labels(self.job_name).set(in_progress)

    def report_acknowledged(self, checkpoint_id: int, participant: str, ack_timestamp_ms: int,
                            metrics: Mapping[str, Any] | None = None) -> None:
        """One participant's part is durable. `metrics` as the participant sent them with
        its ack: `bytes` it wrote, `async_ms` its asynchronous part took."""
        with self._lock:
            self._record_ack(self._entry(checkpoint_id), participant, ack_timestamp_ms, metrics)

    @staticmethod
    def _record_ack(entry: dict[str, Any], participant: str, ack_timestamp_ms: int,
                    metrics: Mapping[str, Any] | None, late: bool = False) -> None:
        """Under the lock."""
        metrics = dict(metrics or {})
        entry["participants"][participant] = {
            "ack_timestamp": ack_timestamp_ms,
            "late": late,
            "bytes": int(metrics.get("bytes", 0) or 0),
            "async_ms": int(metrics["async_ms"]) if metrics.get("async_ms") is not None else None,
            "metrics": metrics,
        }
        entry["latest_ack_timestamp"] = max(entry["latest_ack_timestamp"] or 0, ack_timestamp_ms)

    def report_late_acknowledged(self, checkpoint_id: int, participant: str, ack_timestamp_ms: int,
                                 metrics: Mapping[str, Any] | None = None) -> None:
        """An ack that arrived after its checkpoint was aborted: the snapshot was written
        all the same, so the failed checkpoint's details show it and its state size
        counts it (Flink reports such stats too); it is shown as late and not counted in
        `num_acknowledged`. Changes nothing for a checkpoint not in the history, nor for a
        participant already recorded."""
        with self._lock:
            entry = self._history.get(checkpoint_id)
            if entry is None or participant in entry["participants"] or entry["status"] == "COMPLETED":
                return
            self._record_ack(entry, participant, ack_timestamp_ms, metrics, late=True)
            if entry["status"] != "IN_PROGRESS":
                entry["state_size"] = _acknowledged_bytes(entry)

    def report_completed(self, checkpoint_id: int, duration_ms: int, size_bytes: int,
                         completed_at_ms: int) -> None:
        with self._lock:
            self._completed += 1
            self._in_progress.discard(checkpoint_id)
            in_progress = len(self._in_progress)
            self._durations_ms.append(duration_ms)
            self._sizes.append(size_bytes)
            self._last_completed = {"id": checkpoint_id, "duration_ms": duration_ms,
                                    "size_bytes": size_bytes, "completed_at_ms": completed_at_ms}
            entry = self._entry(checkpoint_id)
            entry.update(status="COMPLETED", end_to_end_duration=duration_ms, state_size=size_bytes,
                         completion_timestamp=completed_at_ms,
                         # the coordinator's clock, exact: the trigger is `duration` before completion
                         trigger_timestamp=completed_at_ms - duration_ms)
            sync_ms, async_ms = _parts(entry)
            entry.update(sync_duration=sync_ms, async_duration=async_ms)
            if sync_ms is not None:
                self._sync_ms.append(sync_ms)
            if async_ms is not None:
                self._async_ms.append(async_ms)
        self._m_completed.labels(self.job_name).inc()
        self._m_in_progress.labels(self.job_name).set(in_progress)
        self._m_last_id.labels(self.job_name).set(checkpoint_id)
        self._m_last_duration.labels(self.job_name).set(duration_ms / 1000)
        self._m_last_size.labels(self.job_name).set(size_bytes)
        self._m_duration.labels(self.job_name).observe(duration_ms / 1000)
        self._m_size.labels(self.job_name).observe(size_bytes)
        if sync_ms is not None:
            self._m_part.labels(self.job_name, "sync").observe(sync_ms / 1000)
        if async_ms is not None:
            self._m_part.labels(self.job_name, "async").observe(async_ms / 1000)

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
                entry = self._entry(checkpoint_id)
                # What its acks wrote is in checkpoint storage until the abort deletes it
                # (Flink's FailedCheckpointStats keeps the state size too).
                entry.update(status="ABORTED" if reason in _NOT_A_FAILURE else "FAILED",
                             failure_reason=reason.name, failure_message=reason.message,
                             failure_timestamp=failed_at_ms, state_size=_acknowledged_bytes(entry))
                if entry["trigger_timestamp"] is not None:
                    entry["end_to_end_duration"] = max(0, failed_at_ms - entry["trigger_timestamp"])
            in_progress = len(self._in_progress)
        self._m_failed.labels(self.job_name, reason.name).inc()
        self._m_in_progress.labels(self.job_name).set(in_progress)

    def report_restored(self, checkpoint_id: int, restore_timestamp_ms: int | None = None,
                        external_path: str | None = None) -> None:
        """The job (re)started from completed checkpoint `checkpoint_id`."""
        with self._lock:
            self._restored += 1
            self._last_restored = {"id": checkpoint_id, "external_path": external_path,
                                   "restore_timestamp": restore_timestamp_ms if restore_timestamp_ms
                                   is not None else self._now_ms()}
        self._m_restored.labels(self.job_name).inc()

    def report_commit(self, failed: bool) -> int:
        """A completed checkpoint's commit ended; returns the failed commits in a row."""
        with self._lock:
            if failed:
                self._commit_failures += 1
                self._consecutive_commit_failures += 1
            else:
                self._consecutive_commit_failures = 0
            streak = self._consecutive_commit_failures
        if failed:
            self._m_commit_failed.labels(self.job_name).inc()
        self._m_commit_streak.labels(self.job_name).set(streak)
        return streak

    def report_restore_refused(self, reason: RestoreRefusal) -> None:
        """The job refused to start from its checkpoints (or a savepoint) for `reason`."""
        with self._lock:
            self._restore_refusals[reason.name] += 1
        self._m_refused.labels(self.job_name, reason.name).inc()

    # ------------------------------------------------------------------ views
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
                "restored": self._restored,
                "restore_refusals": dict(self._restore_refusals),
                "commit_failures": self._commit_failures,
                "consecutive_commit_failures": self._consecutive_commit_failures,
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
                "last_restored": dict(self._last_restored) if self._last_restored else None,
                "duration_p50_ms": _percentile(durations, 0.50),
                "duration_p99_ms": _percentile(durations, 0.99),
            }

    def summary(self) -> dict[str, dict[str, int | None]]:
        """min/avg/p50/p90/p99/max of the completed checkpoints' duration, size and parts
        (the shape of Flink's checkpoint statistics summary)."""
        with self._lock:
            series = {"end_to_end_duration": list(self._durations_ms), "state_size": list(self._sizes),
                      "sync_duration": list(self._sync_ms), "async_duration": list(self._async_ms)}
        return {name: _distribution(values) for name, values in series.items()}

    def history(self) -> list[dict[str, Any]]:
        """Recent checkpoints, newest first, without their participants."""
        with self._lock:
            return [_public(e, with_participants=False) for e in reversed(self._history.values())]

    def details(self, checkpoint_id: int) -> dict[str, Any] | None:
        """One recent checkpoint with its participants; None if it is not (or no longer) known."""
        with self._lock:
            entry = self._history.get(checkpoint_id)
            return _public(entry, with_participants=True) if entry is not None else None


def _acknowledged_bytes(entry: dict[str, Any]) -> int:
    return sum(p["bytes"] for p in entry["participants"].values())


def _parts(entry: dict[str, Any]) -> tuple[int | None, int | None]:
    """The slowest participant's synchronous part (trigger to the start of its
    asynchronous part, or to its ack) and the longest asynchronous part."""
    trigger = entry.get("trigger_timestamp")
    participants = entry["participants"].values()
    if trigger is None or not participants:
        return None, None
    sync = [max(0, p["ack_timestamp"] - trigger - (p["async_ms"] or 0)) for p in participants]
    asyncs = [p["async_ms"] for p in participants if p["async_ms"] is not None]
    return max(sync), (max(asyncs) if asyncs else 0)


def _public(entry: dict[str, Any], with_participants: bool) -> dict[str, Any]:
    out = {k: v for k, v in entry.items() if k != "participants"}
    out["num_acknowledged"] = sum(1 for p in entry["participants"].values() if not p["late"])
    if with_participants:
        trigger = entry.get("trigger_timestamp")
        out["participants"] = [
            {"id": name, "ack_timestamp": p["ack_timestamp"], "bytes": p["bytes"],
             "sync_duration": (max(0, p["ack_timestamp"] - trigger - (p["async_ms"] or 0))
                               if trigger is not None else None),
             "async_duration": p["async_ms"] or 0, "late": p["late"],
             "end_to_end_duration": (p["ack_timestamp"] - trigger) if trigger is not None else None}
            for name, p in sorted(entry["participants"].items())]
    return out


def _distribution(values: list[int]) -> dict[str, int | None]:
    ordered = sorted(values)
    return {"count": len(ordered),
            "min": ordered[0] if ordered else None,
            "avg": int(sum(ordered) / len(ordered)) if ordered else None,
            "p50": _percentile(ordered, 0.50), "p90": _percentile(ordered, 0.90),
            "p99": _percentile(ordered, 0.99), "max": ordered[-1] if ordered else None}
