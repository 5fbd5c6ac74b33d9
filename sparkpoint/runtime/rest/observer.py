"""What the REST API and /metrics show beyond the checkpoint statistics: failovers,
alarms and restores as they happen, and the job's runtime numbers at scrape time.

The job's attributes are written by the epoch loop and read here from the server's
threads: each is one int, or a dict replaced whole, so a read sees an old or a new value,
never a torn one. Everything this module keeps itself is guarded by its lock."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sparkpoint.checkpoint.alarms import CheckpointFailureEvent
from sparkpoint.redaction import mask_url
from sparkpoint.runtime.status import JobStatus

log = logging.getLogger(__name__)

_KEPT_EVENTS = 100
_LAG_CACHE_S = 1.0  # a file source's lag lists a directory: not on every request


def _now_ms() -> int:
    return int(time.time() * 1000)


def _shown(text: str | None) -> str | None:
    # Error texts often quote the storage URL they failed on, credentials included, and
    # the read-only views are open to every local user.
    return mask_url(text) if text else text


class JobObserver:
    def __init__(self, job: Any) -> None:
        self.job = job
        self.start_time_ms = _now_ms()
        self.end_time_ms: int | None = None
        self._lock = threading.Lock()
        self._failovers: deque[dict[str, Any]] = deque(maxlen=_KEPT_EVENTS)
        self._alarms: deque[dict[str, Any]] = deque(maxlen=_KEPT_EVENTS)
        self._failover_count = 0
        self._status_since_ms = self.start_time_ms
        self._lag: tuple[float, dict[str, int]] = (0.0, {})
        self._rate: deque[tuple[float, int]] = deque(maxlen=32)
        job.status.add_listener(self._on_status)
        self._unregister_alarms = job.coordinator.alarms.register(self._on_alarm)

    def close(self) -> None:
        self._unregister_alarms()

    # -- events --------------------------------------------------------------------------
    def _on_status(self, old: JobStatus, new: JobStatus, error: BaseException | None) -> None:
        now = _now_ms()
        with self._lock:
            self._status_since_ms = now
            if new is JobStatus.FAILING:
                self._failover_count += 1
                self._failovers.append({"timestamp": now, "kind": "failover",
                                        "exception": _shown(_summary(error)), "epoch": self.job.epoch})
            elif new is JobStatus.FAILED:
                self._failovers.append({"timestamp": now, "kind": "job failed",
                                        "exception": _shown(_summary(error)), "epoch": self.job.epoch})
            if new.terminal:
                self.end_time_ms = now

    def _on_alarm(self, event: CheckpointFailureEvent) -> None:
        with self._lock:
            self._alarms.append({"timestamp": event.timestamp_ms, "checkpoint_id": event.checkpoint_id,
                                 "reason": event.reason.name, "message": event.reason.message,
                                 "action": event.reason.action, "participant": event.participant,
                                 "error": _shown(event.error_summary), "counted": event.counted,
                                 "consecutive_failures": event.consecutive_failures,
                                 "threshold": event.threshold})

    # -- views ---------------------------------------------------------------------------
    def exceptions(self) -> dict[str, Any]:
        with self._lock:
            return {"failovers": list(reversed(self._failovers)), "alarms": list(reversed(self._alarms)),
                    "failover_count": self._failover_count}

    def failure_messages(self) -> dict[int, str]:
        """checkpoint id -> what its alarm said (error and participant), newest wins."""
        with self._lock:
            return {a["checkpoint_id"]: " ".join(x for x in (
                a["error"], f"(participant {a['participant']})" if a["participant"] else None) if x)
                for a in self._alarms if a["checkpoint_id"] is not None and (a["error"] or a["participant"])}

    def lag(self) -> dict[str, int]:
        now = time.monotonic()
        with self._lock:
            at, cached = self._lag
            if now - at < _LAG_CACHE_S:
                return dict(cached)
        try:
            lag = self.job.source_lag()
        except Exception as e:  # best effort, like the progress line's
            log.debug("source lag unavailable: %s", e)
            lag = cached
        with self._lock:
            self._lag = (now, lag)
        return dict(lag)

    def records_per_second(self) -> float:
        now, records = time.monotonic(), int(self.job.records)
        with self._lock:
            self._rate.append((now, records))
            while len(self._rate) > 2 and now - self._rate[0][0] > 10:
                self._rate.popleft()
            (t0, r0), (t1, r1) = self._rate[0], self._rate[-1]
        return max(0.0, (r1 - r0) / (t1 - t0)) if t1 - t0 >= 0.5 else 0.0

    def overview(self) -> dict[str, Any]:
        job = self.job
        stats = job.coordinator.stats.snapshot()
        lag = self.lag()
        progress = getattr(job, "progress", None)
        now = _now_ms()
        with self._lock:
            failovers = self._failover_count
            status_since = self._status_since_ms
            end = self.end_time_ms
        return {
            "jid": job.job_name, "name": job.job_name, "state": job.status.status.value,
            "run-id": job.run_id, "start-time": self.start_time_ms, "end-time": end if end is not None else -1,
            "duration": (end or now) - self.start_time_ms, "state-since": status_since,
            "restarts": int(job.restarts), "failovers": failovers, "epoch": int(job.epoch),
            "records-in": int(job.records),
            "records-out": int(getattr(progress, "output_rows", 0) or 0),
            "late-dropped": int(getattr(job, "late_dropped", 0) or 0),
            "records-in-per-second": round(self.records_per_second(), 1),
            "watermark": _watermark(job), "max-event-time": job.max_event_time,
            "lag": sum(lag.values()), "lag-per-split": lag, "parallelism": int(job.P),
            "restored-from": job.restored_from,
            "checkpoints": {"completed": stats["completed"], "failed": stats["counted_failed"],
                            "in_progress": stats["in_progress"], "last_completed_id": stats["last_completed_id"]},
        }


def _watermark(job: Any) -> int | None:
    try:
        return job._watermark()
    except Exception:
        return None


def _summary(error: BaseException | None) -> str | None:
    if error is None:
        return None
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 1000 else text[:997] + "..."


class RuntimeCollector:
    """The job's runtime numbers on its Prometheus registry, read at scrape time (the
    checkpoint statistics and the Kafka source register their own metrics there)."""

    def __init__(self, observer: JobObserver) -> None:
        self._observer = observer

    def describe(self):
        # Without describe() the registry would call collect() at registration, before
        # the job is set up.
        return self._families({}, None)

    def collect(self):
        o = self._observer
        try:
            overview = o.overview()
        except Exception as e:  # a scrape must never fail because the job is mid-restart
            log.debug("runtime metrics unavailable: %s", e)
            return []
        return self._families(overview, o.exceptions()["failover_count"])

    def _families(self, ov: dict[str, Any], failovers: int | None):
        job = self._observer.job.job_name
        fams = []

        def gauge(name: str, doc: str, value: Any, extra: dict[str, str] | None = None):
            fam = GaugeMetricFamily(name, doc, labels=["job_name", *(extra or {})])
            if value is not None:
                fam.add_metric([job, *(extra or {}).values()], value)
            fams.append(fam)
            return fam

        def counter(name: str, doc: str, value: Any):
            fam = CounterMetricFamily(name, doc, labels=["job_name"])
            if value is not None:
                fam.add_metric([job], value)
            fams.append(fam)

        counter("sparkpoint_epochs", "Epochs run (the epoch number + 1)",
                ov["epoch"] + 1 if ov else None)
        counter("sparkpoint_records_in", "Records read by this run", ov.get("records-in"))
        counter("sparkpoint_records_out", "Rows handed to the sink by this run", ov.get("records-out"))
        counter("sparkpoint_late_dropped_records", "Rows dropped as later than the allowed lateness, in this run",
                ov.get("late-dropped"))
        counter("sparkpoint_failovers", "Failovers (restore from the latest checkpoint) of this run", failovers)
        counter("sparkpoint_restarts", "Restarts by the restart strategy", ov.get("restarts"))
        gauge("sparkpoint_watermark_milliseconds", "Current event-time watermark (epoch ms)", ov.get("watermark"))
        gauge("sparkpoint_uptime_seconds", "Seconds since this run started",
              ov["duration"] / 1000 if ov else None)
        lag = GaugeMetricFamily("sparkpoint_source_lag_records", "Records behind the source's end, per split",
                                labels=["job_name", "split"])
        for split, n in sorted((ov.get("lag-per-split") or {}).items()):
            lag.add_metric([job, split], n)
        fams.append(lag)
        status = GaugeMetricFamily("sparkpoint_job_status", "1 for the job's current status",
                                   labels=["job_name", "status"])
        if ov:
            for s in JobStatus:
                status.add_metric([job, s.value], 1 if s.value == ov["state"] else 0)
        fams.append(status)
        return fams
