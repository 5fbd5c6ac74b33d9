"""One checkpoint attempt in flight: who still has to acknowledge, and what the others
handed back.

Not thread-safe on its own: the coordinator touches it only under its lock.
"""

from __future__ import annotations

from concurrent.futures import Future
from enum import Enum
from typing import Any, Iterable, Mapping

from sparkpoint.checkpoint.interfaces import (
    Cancellable,
    CheckpointLocation,
    CheckpointProperties,
    CompletedCheckpointData,
    ParticipantId,
    StateHandle,
)
from sparkpoint.checkpoint.reasons import CheckpointFailureReason

# Key in an ack's metrics dict: bytes this participant wrote for the checkpoint.
METRIC_BYTES = "bytes"


class AckResult(Enum):
    SUCCESS = "success"
    DUPLICATE = "duplicate"  # this participant already acknowledged this checkpoint
    UNKNOWN = "unknown"  # no such checkpoint, or the participant is not part of it
    DISCARDED = "discarded"  # the attempt is over (aborted, subsumed or completed)


class PendingCheckpoint:
    def __init__(self, checkpoint_id: int, trigger_timestamp_ms: int, location: CheckpointLocation,
                 participants: Iterable[ParticipantId], properties: CheckpointProperties):
        self.checkpoint_id = checkpoint_id
        self.trigger_timestamp_ms = trigger_timestamp_ms
        self.location = location
        self.properties = properties
        self._not_yet_acknowledged: set[ParticipantId] = set(participants)
        self._handles: dict[ParticipantId, StateHandle] = {}
        self._metrics: dict[ParticipantId, Mapping[str, Any]] = {}
        self._expiry: Cancellable | None = None
        self._disposed = False
        self.failure_reason: CheckpointFailureReason | None = None
        # Completed with the CompletedCheckpointData, or failed with CheckpointFailedError.
        # The coordinator resolves it outside its lock: callbacks run inline.
        self.completion_future: Future[CompletedCheckpointData] = Future()

    # -- acknowledgements -----------------------------------------------------------
    def acknowledge(self, participant: ParticipantId, handle: StateHandle,
                    metrics: Mapping[str, Any] | None = None) -> AckResult:
        if self._disposed:
            return AckResult.DISCARDED
        if participant in self._handles:
            return AckResult.DUPLICATE
        if participant not in self._not_yet_acknowledged:
            return AckResult.UNKNOWN
        self._not_yet_acknowledged.discard(participant)
        self._handles[participant] = handle
        self._metrics[participant] = dict(metrics or {})
        return AckResult.SUCCESS

    @property
    def is_fully_acknowledged(self) -> bool:
        return not self._not_yet_acknowledged

    @property
    def not_yet_acknowledged(self) -> frozenset[ParticipantId]:
        return frozenset(self._not_yet_acknowledged)

    @property
    def acknowledged_handles(self) -> dict[ParticipantId, StateHandle]:
        return dict(self._handles)

    def state_size_bytes(self) -> int:
        return sum(int(m.get(METRIC_BYTES, 0) or 0) for m in self._metrics.values())

    # -- lifecycle -----------------------------------------------------------------
    def set_expiry(self, expiry: Cancellable) -> bool:
        """Attach the expiry timer. False (and the timer is cancelled) if the attempt is
        already over, e.g. a fast decline raced with registering the timer."""
        if self._disposed:
            expiry.cancel()
            return False
        self._expiry = expiry
        return True

    @property
    def is_disposed(self) -> bool:
        return self._disposed

    def abort(self, reason: CheckpointFailureReason) -> bool:
        """End the attempt as failed. False if it was already over (then nothing changes)."""
        if self._disposed:
            return False
        self.failure_reason = reason
        self._dispose()
        return True

    def mark_finalizing(self) -> None:
        """All acks are in: no more messages or expiry apply to this attempt."""
        self._dispose()

    def _dispose(self) -> None:
        self._disposed = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
