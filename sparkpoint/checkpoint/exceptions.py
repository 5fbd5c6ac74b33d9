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
