"""Exceptions of the checkpoint coordinator. All derive from SparkpointError."""

from __future__ import annotations

from sparkpoint.checkpoint.reasons import CheckpointFailureReason
from sparkpoint.errors import SparkpointError


class CheckpointFailedError(SparkpointError):
    """The outcome of a checkpoint that did not complete; set on the future that
    `trigger_checkpoint` returns. `reason` says why, `checkpoint_id` is None when the
    checkpoint was refused before it got an id."""

    def __init__(self, reason: CheckpointFailureReason, checkpoint_id: int | None = None,
                 detail: str | None = None):
        self.reason = reason
        self.checkpoint_id = checkpoint_id
        what = f"checkpoint {checkpoint_id}" if checkpoint_id is not None else "checkpoint request"
        text = f"{what} failed: {reason.name}: {reason.message}"
        if detail:
            text += f" ({detail})"
        super().__init__(text)


class TolerableCheckpointFailuresExceeded(SparkpointError):
    """More consecutive checkpoints failed than execution.checkpointing.tolerable-failed-checkpoints
    allows. The causes are in the WARNING lines before this one; fix those (usually
    checkpoint storage), or raise the tolerance if the failures are expected to pass."""


class CoordinatorShutDownError(SparkpointError):
    """The checkpoint coordinator was shut down; build a new one to checkpoint again."""


class CheckpointsStillFinalizingError(SparkpointError):
    """`suspend_and_settle` timed out while checkpoints were still writing `_metadata` or
    notifying participants (checkpoint storage hangs). Do not restore in this process:
    such a checkpoint may still complete and commit its sinks. Fail the job (a fresh
    process restores from what storage then holds) or call `suspend_and_settle` again."""

    def __init__(self, checkpoint_ids: tuple[int, ...], timeout_s: float):
        self.checkpoint_ids = checkpoint_ids
        shown = ", ".join(map(str, checkpoint_ids))
        super().__init__(f"checkpoint(s) {shown} still finalizing after {timeout_s:g} s; "
                         "checkpoint storage may hang. Do not restore in this process: fail "
                         "the job, or wait again")
