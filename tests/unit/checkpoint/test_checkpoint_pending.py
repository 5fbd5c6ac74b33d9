from __future__ import annotations

from sparkpoint.checkpoint import AckResult, CheckpointFailureReason as R, CheckpointProperties, PendingCheckpoint
from sparkpoint.checkpoint.scheduler import ScheduledTask
from tests.memory import InMemoryLocation


def pending(participants=("a", "b")) -> PendingCheckpoint:
    return PendingCheckpoint(7, 100, InMemoryLocation(7), participants, CheckpointProperties())


def test_acknowledge_outcomes():
    p = pending()
    assert p.acknowledge("a", {"f": 1}, {"bytes": 10}) is AckResult.SUCCESS
    assert p.acknowledge("a", {"f": 2}) is AckResult.DUPLICATE
    assert p.acknowledge("z", {}) is AckResult.UNKNOWN
    assert not p.is_fully_acknowledged
    assert p.not_yet_acknowledged == {"b"}
    assert p.acknowledge("b", {"f": 3}, {"bytes": 5}) is AckResult.SUCCESS
    assert p.is_fully_acknowledged
    assert p.acknowledged_handles == {"a": {"f": 1}, "b": {"f": 3}}
    assert p.state_size_bytes() == 15


def test_abort_disposes_once_and_cancels_expiry():
    p = pending()
    expiry = ScheduledTask(lambda: None, 0)
    assert p.set_expiry(expiry)
    assert p.abort(R.EXPIRED)
    assert expiry.cancelled and p.is_disposed and p.failure_reason is R.EXPIRED
    assert not p.abort(R.DECLINED_BY_TASK)
    assert p.failure_reason is R.EXPIRED
    assert p.acknowledge("a", {}) is AckResult.DISCARDED


def test_expiry_attached_after_disposal_is_cancelled():
    p = pending()
    p.abort(R.DECLINED_BY_TASK)
    late = ScheduledTask(lambda: None, 0)
    assert not p.set_expiry(late)
    assert late.cancelled
