"""Whether a checkpoint may start now: Flink's trigger pre-checks as one pure function.

The coordinator takes a snapshot of its state, asks `decide_trigger`, and applies the
answer; the policy itself holds no state and touches no clock, so it is tested alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkpoint.checkpoint.interfaces import CheckpointProperties
from sparkpoint.checkpoint.reasons import CheckpointFailureReason as R


@dataclass(frozen=True)
class TriggerState:
    now_ms: int
    shutdown: bool
    periodic_scheduling: bool
    request_queued: bool
    pending_count: int
    max_concurrent: int
    last_completion_ms: int | None
    min_pause_ms: int
    # suspended for a failover (`suspend_and_settle`) until the scheduler starts again
    suspended: bool = False


@dataclass(frozen=True)
class TriggerDecision:
    """`refusal` None means start the checkpoint. For a refused periodic request:
    `queue_request` - remember it and stop the periodic timer until an attempt ends;
    `retry_in_ms` - move the periodic timer to fire when the min pause is over."""

    refusal: R | None = None
    queue_request: bool = False
    retry_in_ms: int | None = None

    @property
    def start(self) -> bool:
        return self.refusal is None


START = TriggerDecision()


def decide_trigger(props: CheckpointProperties, state: TriggerState) -> TriggerDecision:
    """The checks, in Flink's order: shut down (or suspended for a failover); periodic
    scheduling off (periodic requests only); a request already queued; too many
    concurrent; min pause not over (periodic requests only, as in Flink's
    CheckpointRequestDecider). Forced requests skip the queue, concurrency and pause
    checks. (Whether participants run is asked of the gateway afterwards, outside the
    coordinator's lock.) `pending_count` includes triggers still waiting for storage."""
    if state.shutdown:
        return TriggerDecision(R.COORDINATOR_SHUTDOWN)
    if state.suspended:
        return TriggerDecision(R.COORDINATOR_SUSPENDING)
    if props.periodic and not state.periodic_scheduling:
        return TriggerDecision(R.PERIODIC_SCHEDULER_SHUTDOWN)
    if props.forced:
        return START
    if state.request_queued:
        return TriggerDecision(R.ALREADY_QUEUED)
    if state.pending_count >= state.max_concurrent:
        # Only the periodic timer's request is queued: a manual request is answered now,
        # and its caller decides whether to ask again.
        return TriggerDecision(R.TOO_MANY_CONCURRENT, queue_request=props.periodic)
    if props.periodic and state.last_completion_ms is not None:
        wait_ms = state.last_completion_ms + state.min_pause_ms - state.now_ms
        if wait_ms > 0:
            return TriggerDecision(R.MINIMUM_TIME_BETWEEN_CHECKPOINTS, retry_in_ms=wait_ms)
    return START
