"""One place that turns a checkpoint failure into its consequences: the failure
manager's verdict, a log line a person can act on, metrics, and an alarm event."""

from __future__ import annotations

import logging
from typing import Callable

from sparkpoint.checkpoint.alarms import AlarmBus, CheckpointFailureEvent, summarize_error
from sparkpoint.checkpoint.failure_manager import CheckpointFailureManager, FailureOutcome, FailureVerdict
from sparkpoint.checkpoint.interfaces import ParticipantId
from sparkpoint.checkpoint.reasons import CheckpointFailureReason as R
from sparkpoint.checkpoint.stats import CheckpointStatsTracker

# The coordinator's logger: one logger to follow for everything about checkpoints.
log = logging.getLogger("sparkpoint.checkpoint.coordinator")

_NOT_COUNTED_BECAUSE = {
    FailureOutcome.NOT_COUNTED: "not counted: this reason never counts",
    FailureOutcome.STALE: "not counted: older than the latest completed checkpoint",
    FailureOutcome.ALREADY_COUNTED: "not counted: this checkpoint already counted once",
}


def raises_alarm(checkpoint_id: int | None, reason: R) -> bool:
    """Every failure of a checkpoint that got an id, and every counted failure. A
    "not now" refusal before an id was assigned raises none (docs/failure-reasons.md)."""
    return checkpoint_id is not None or reason.counted


class FailureReporter:
    def __init__(self, job_name: str, failure_manager: CheckpointFailureManager,
                 stats: CheckpointStatsTracker, alarms: AlarmBus, now_ms: Callable[[], int]) -> None:
        self.job_name = job_name
        self._failure_manager = failure_manager
        self._stats = stats
        self._alarms = alarms
        self._now_ms = now_ms

    def report(self, checkpoint_id: int | None, reason: R, error: BaseException | None = None,
               participant: ParticipantId | None = None, detail: str | None = None) -> FailureVerdict:
        """Call without holding any coordinator lock: this may fail the job."""
        verdict = self._failure_manager.handle_failure(checkpoint_id, reason, error, participant)
        counted = reason.counted and verdict.outcome.counted
        now = self._now_ms()
        self._log(checkpoint_id, reason, error, participant, detail, verdict)
        self._stats.report_failed(checkpoint_id, reason, now)
        if raises_alarm(checkpoint_id, reason):
            self._alarms.emit(CheckpointFailureEvent(
                checkpoint_id=checkpoint_id, reason=reason, participant=participant,
                error_summary=summarize_error(error) or detail,
                consecutive_failures=verdict.consecutive_failures,
                threshold=self._failure_manager.tolerable, counted=counted, timestamp_ms=now,
                job_name=self.job_name))
        return verdict

    def _log(self, checkpoint_id: int | None, reason: R, error: BaseException | None,
             participant: ParticipantId | None, detail: str | None, verdict: FailureVerdict) -> None:
        counted = reason.counted and verdict.outcome.counted
        if reason.fatal:
            level = logging.ERROR
        elif counted or reason is R.ID_COLLISION:
            level = logging.WARNING
        elif checkpoint_id is not None or reason is R.NOT_ALL_REQUIRED_TASKS_RUNNING:
            level = logging.INFO
        else:
            level = logging.DEBUG  # "not now": happens by design on every busy job
        if not log.isEnabledFor(level):
            return
        if checkpoint_id is None and not reason.counted:
            head = f"checkpoint request of job {self.job_name} refused"
        else:
            what = f"checkpoint {checkpoint_id}" if checkpoint_id is not None else "checkpoint"
            head = f"{what} of job {self.job_name} failed"
        parts = [f"{head}: {reason.name}: {reason.message}"]
        if participant:
            parts.append(f"participant {participant}")
        if detail:
            parts.append(detail)
        if error is not None:
            parts.append(f"error: {summarize_error(error)}")
        tolerable = self._failure_manager.tolerable
        if verdict.outcome is FailureOutcome.JOB_FAILED and counted:
            parts.append(f"{verdict.consecutive_failures} consecutive counted failures, more than "
                         f"the {tolerable} tolerated: failing the job")
        elif verdict.outcome is FailureOutcome.JOB_FAILED:
            parts.append("stopping the job; it must not be restarted")
        elif counted:
            parts.append(f"consecutive counted failures: {verdict.consecutive_failures} of "
                         f"{tolerable} tolerated")
        else:
            parts.append(_NOT_COUNTED_BECAUSE.get(verdict.outcome, "not counted"))
        parts.append(f"what to do: {reason.action}")
        log.log(level, "; ".join(parts))
