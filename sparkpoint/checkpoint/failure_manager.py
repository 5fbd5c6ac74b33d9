"""Counts consecutive checkpoint failures and fails the job past the tolerance.

Rules (seeds 000, 001, 003):
- only reasons with `counted=True` count;
- a checkpoint id counts at most once, however many participants report it failed;
- failures of checkpoints older than the last success are stale and ignored (a late
  error from an attempt that no longer matters must not fail the job);
- a success resets the count of the failures older than it;
- one counted failure more than `tolerable` calls `fail_job` once, then counting
  starts again from zero (the restart strategy decides what happens to the job);
- a fatal reason (LEASE_LOST) calls `fail_job` at once, and only the first time.

`fail_job(reason, error)` is never called while this object's lock is held, so it may
call back into the coordinator. If it raises, the error is logged, not propagated.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from enum import Enum
from typing import Callable

from sparkpoint.checkpoint.exceptions import CheckpointFailedError, TolerableCheckpointFailuresExceeded
from sparkpoint.checkpoint.interfaces import ParticipantId
from sparkpoint.checkpoint.reasons import CheckpointFailureReason

log = logging.getLogger(__name__)

FailJob = Callable[[CheckpointFailureReason, BaseException], None]


class FailureOutcome(Enum):
    NOT_COUNTED = "not_counted"  # the reason never counts
    STALE = "stale"  # older than the last successful checkpoint
    ALREADY_COUNTED = "already_counted"  # this checkpoint id already counted once
    COUNTED = "counted"  # counted, still within the tolerance
    JOB_FAILED = "job_failed"  # counted past the tolerance, or fatal: fail_job was called

    @property
    def counted(self) -> bool:
        return self in (FailureOutcome.COUNTED, FailureOutcome.JOB_FAILED)


@dataclass(frozen=True)
class FailureVerdict:
    outcome: FailureOutcome
    # Counted consecutive failures including this one (before a reset by JOB_FAILED).
    consecutive_failures: int


class CheckpointFailureManager:
    def __init__(self, tolerable: int, fail_job: FailJob) -> None:
        if tolerable < 0:
            raise ValueError(f"tolerable must be >= 0, got {tolerable}")
        self.tolerable = tolerable
        self._fail_job = fail_job
        self._lock = threading.Lock()
        self._last_success_id = -1
        self._counted_ids: set[int] = set()
        self._counted_without_id = 0  # failures before an id was assigned (IO_EXCEPTION)
        self._fatal_reported = False

    @property
    def consecutive_failures(self) -> int:
        with self._lock:
            return len(self._counted_ids) + self._counted_without_id

    @property
    def last_success_id(self) -> int | None:
        with self._lock:
            return self._last_success_id if self._last_success_id >= 0 else None

    def handle_failure(self, checkpoint_id: int | None, reason: CheckpointFailureReason,
                       error: BaseException | None = None,
                       participant: ParticipantId | None = None) -> FailureVerdict:
        if reason.fatal:
            return self._handle_fatal(reason, error)
        with self._lock:
            count = len(self._counted_ids) + self._counted_without_id
            if not reason.counted:
                return FailureVerdict(FailureOutcome.NOT_COUNTED, count)
            if checkpoint_id is not None:
                if checkpoint_id <= self._last_success_id:
                    return FailureVerdict(FailureOutcome.STALE, count)
                if checkpoint_id in self._counted_ids:
                    return FailureVerdict(FailureOutcome.ALREADY_COUNTED, count)
                self._counted_ids.add(checkpoint_id)
            else:
                self._counted_without_id += 1
            count += 1
            if count <= self.tolerable:
                return FailureVerdict(FailureOutcome.COUNTED, count)
            self._counted_ids.clear()
            self._counted_without_id = 0
        what = f"checkpoint {checkpoint_id}" if checkpoint_id is not None else "a checkpoint"
        by = f" (participant {participant})" if participant else ""
        failure = TolerableCheckpointFailuresExceeded(
            f"{count} consecutive checkpoints failed, more than "
            f"execution.checkpointing.tolerable-failed-checkpoints={self.tolerable}; the last: "
            f"{what}{by}: {reason.name} ({reason.message}). What to do: {reason.action}")
        if error is not None:
            failure.__cause__ = error
        log.error("failing the job: %s", failure)
        self._call_fail_job(reason, failure)
        return FailureVerdict(FailureOutcome.JOB_FAILED, count)

    def handle_success(self, checkpoint_id: int) -> None:
        with self._lock:
            if checkpoint_id <= self._last_success_id:
                return
            self._last_success_id = checkpoint_id
            # Failures of newer checkpoints (possible with concurrent checkpoints)
            # happened after this success in id order, so they stay counted.
            self._counted_ids = {i for i in self._counted_ids if i > checkpoint_id}
            self._counted_without_id = 0

    def _handle_fatal(self, reason: CheckpointFailureReason,
                      error: BaseException | None) -> FailureVerdict:
        with self._lock:
            count = len(self._counted_ids) + self._counted_without_id
            if self._fatal_reported:
                return FailureVerdict(FailureOutcome.ALREADY_COUNTED, count)
            self._fatal_reported = True
        failure = error if error is not None else CheckpointFailedError(reason)
        log.error("checkpointing must stop: %s: %s. %s", reason.name, reason.message, reason.action)
        self._call_fail_job(reason, failure)
        return FailureVerdict(FailureOutcome.JOB_FAILED, count)

    def _call_fail_job(self, reason: CheckpointFailureReason, failure: BaseException) -> None:
        """The callback's own error must not abort the caller half-way: the coordinator
        still has to stop the checkpoint's writers and delete its files, or a failing job
        also leaks them."""
        try:
            self._fail_job(reason, failure)
        except Exception:
            log.exception("the fail-job callback raised while failing the job for %s; the job "
                          "may still be running although it should have failed: fix the "
                          "callback (runtime) and stop the job by hand", reason.name)
