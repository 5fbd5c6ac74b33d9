"""The trigger policy alone: Flink's pre-checks, in order."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sparkpoint.checkpoint import CheckpointFailureReason as R, CheckpointProperties, TriggerState, decide_trigger

IDLE = TriggerState(now_ms=10_000, shutdown=False, periodic_scheduling=True, request_queued=False,
                    pending_count=0, max_concurrent=1, last_completion_ms=None, min_pause_ms=500)
PERIODIC = CheckpointProperties(forced=False, periodic=True)
MANUAL = CheckpointProperties(forced=False, periodic=False)
FORCED = CheckpointProperties(forced=True, periodic=False)

# Every check failing at once: the earliest in Flink's order wins.
ALL_BAD = replace(IDLE, shutdown=True, periodic_scheduling=False, request_queued=True, pending_count=5,
                  last_completion_ms=9_900)


def test_an_idle_coordinator_starts_a_checkpoint():
    assert decide_trigger(PERIODIC, IDLE).start


@pytest.mark.parametrize("fixed, expected", [
    ({}, R.COORDINATOR_SHUTDOWN),
    ({"shutdown": False}, R.PERIODIC_SCHEDULER_SHUTDOWN),
    ({"shutdown": False, "periodic_scheduling": True}, R.ALREADY_QUEUED),
    ({"shutdown": False, "periodic_scheduling": True, "request_queued": False}, R.TOO_MANY_CONCURRENT),
    ({"shutdown": False, "periodic_scheduling": True, "request_queued": False, "pending_count": 0},
     R.MINIMUM_TIME_BETWEEN_CHECKPOINTS),
])
def test_checks_apply_in_flinks_order(fixed, expected):
    assert decide_trigger(PERIODIC, replace(ALL_BAD, **fixed)).refusal is expected


def test_only_a_periodic_request_is_queued_when_too_many_are_running():
    busy = replace(IDLE, pending_count=1)
    assert decide_trigger(PERIODIC, busy).queue_request
    manual = decide_trigger(MANUAL, busy)
    assert manual.refusal is R.TOO_MANY_CONCURRENT and not manual.queue_request


def test_min_pause_tells_the_periodic_timer_when_to_retry():
    decision = decide_trigger(PERIODIC, replace(IDLE, last_completion_ms=9_900))
    assert decision.refusal is R.MINIMUM_TIME_BETWEEN_CHECKPOINTS and decision.retry_in_ms == 400
    assert decide_trigger(PERIODIC, replace(IDLE, last_completion_ms=9_500)).start


def test_min_pause_applies_to_periodic_requests_only():
    """(Flink's CheckpointRequestDecider: `!isForce() && isPeriodic`)."""
    in_pause = replace(IDLE, last_completion_ms=9_900)
    assert decide_trigger(MANUAL, in_pause).start
    assert decide_trigger(MANUAL, replace(in_pause, pending_count=1)).refusal is R.TOO_MANY_CONCURRENT


def test_forced_skips_queue_concurrency_and_pause_but_not_shutdown():
    busy = replace(IDLE, request_queued=True, pending_count=5, last_completion_ms=9_999)
    assert decide_trigger(FORCED, busy).start
    assert decide_trigger(FORCED, replace(busy, shutdown=True)).refusal is R.COORDINATOR_SHUTDOWN


def test_manual_requests_ignore_whether_periodic_scheduling_is_on():
    assert decide_trigger(MANUAL, replace(IDLE, periodic_scheduling=False)).start
