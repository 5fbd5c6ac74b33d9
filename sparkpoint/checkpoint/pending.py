"""One checkpoint attempt in flight: who still has to acknowledge, and what the others
handed back.

Not thread-safe on its own: the coordinator touches it only under its lock.
"""

from __future__ import annotations

from concurrent.futures import Future
from enum import Enum
from typing import Any, Callable, Iterable, Mapping

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
                 participants: Iterable[ParticipantId], properties: CheckpointProperties,
                 completion_future: Future[CompletedCheckpointData] | None = None):
        self.checkpoint_id = checkpoint_id
        self.trigger_timestamp_ms = trigger_timestamp_ms
        self.location = location
        self.properties = properties
        self._participants = frozenset(participants)
        self._not_yet_acknowledged: set[ParticipantId] = set(self._participants)
        self._handles: dict[ParticipantId, StateHandle] = {}
        self._late_handles: dict[ParticipantId, StateHandle] = {}
        self._metrics: dict[ParticipantId, Mapping[str, Any]] = {}
        self._expiry: Cancellable | None = None
        self._disposed = False
        self._delivering = False
        self._after_delivery: list[Callable[[], None]] = []
        self.failure_reason: CheckpointFailureReason | None = None
        # Completed with the CompletedCheckpointData, or failed with CheckpointFailedError.
        # The coordinator resolves it outside its lock: callbacks run inline.
        self.completion_future: Future[CompletedCheckpointData] = completion_future or Future()

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

    def record_late_ack(self, participant: ParticipantId, handle: StateHandle) -> bool:
        """An ack that arrived after the attempt was aborted: its snapshot's files exist and
        are deleted with the attempt's other files. True if recorded."""
        if not self._disposed or participant not in self._participants or participant in self._handles:
            return False
        self._late_handles.setdefault(participant, handle)
        return True

    def handles_to_discard(self) -> list[StateHandle]:
        """Every handle whose files an abort of this attempt may delete: the acks it
        received, and those that arrived after it was aborted."""
        return list(self._handles.values()) + list(self._late_handles.values())

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

    # -- delivery of the barrier ----------------------------------------------------
    def start_delivery(self) -> None:
        """`gateway.trigger` is about to be called for this attempt."""
        self._delivering = True

    def after_delivery(self, fn: Callable[[], None]) -> bool:
        """Run `fn` once `gateway.trigger` has returned: True if deferred, False if the
        caller must run it now. Keeps `gateway.abort(id)` from overtaking `trigger(id)`."""
        if not self._delivering:
            return False
        self._after_delivery.append(fn)
        return True

    def finish_delivery(self) -> list[Callable[[], None]]:
        """`gateway.trigger` returned (or raised): hand back what was deferred, in order."""
        self._delivering = False
        deferred, self._after_delivery = self._after_delivery, []
        return deferred

    def mark_finalizing(self) -> None:
        """All acks are in: no more messages or expiry apply to this attempt."""
        self._dispose()

    def _dispose(self) -> None:
        self._disposed = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
