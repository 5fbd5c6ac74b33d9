"""Savepoints in the coordinator, with Flink's semantics (ported from the facts of
Flink's CheckpointCoordinatorTest): a savepoint is never subsumed by a checkpoint, and
it never enters the completed-checkpoint store, so it neither counts against the
checkpoints' retention nor is what a failover restores from."""

from __future__ import annotations

import pytest
from checkpoint_fakes import SavepointStorage
from checkpoint_support import failure_reason, make_harness

from sparkpoint.checkpoint import AckResult, CheckpointCoordinator, CheckpointFailureReason as R
from sparkpoint.checkpoint import CheckpointCoordinatorConfig, ManualScheduler
from tests.memory import InMemoryIdCounter, RecordingGateway


def _harness(**kwargs):
    return make_harness(storage=SavepointStorage(), **kwargs)


def _retained(h) -> list[int]:
    return [c.checkpoint_id for c in h.coordinator.completed_store.all()]


def test_a_pending_savepoint_is_not_subsumed_when_a_newer_checkpoint_completes():
    """Flink's testSavepointsAreNotSubsumed: a savepoint, then two checkpoints; the
    second completes and subsumes the first checkpoint, not the savepoint, which then
    completes on its own acks."""
    h = _harness(max_concurrent=10)
    savepoint = h.coordinator.trigger_savepoint("mem://elsewhere/sp")
    first, second = h.trigger(), h.trigger()
    assert h.coordinator.pending_checkpoint_ids() == [1, 2, 3]

    h.ack_all(3)
    assert second.result(0).checkpoint_id == 3
    assert failure_reason(first) is R.SUBSUMED
    assert h.coordinator.pending_checkpoint_ids() == [1]
    assert not savepoint.done()

    assert h.ack_all(1) == [AckResult.SUCCESS] * 3
    data = savepoint.result(0)
    assert data.checkpoint_id == 1 and data.properties.savepoint
    assert h.storage.savepoints["mem://elsewhere/sp"].checkpoint_id == 1
    assert h.gateway.aborted_ids == [2]
    assert h.failures() == {"SUBSUMED": 1}


def test_a_stop_with_savepoint_is_not_subsumed_by_a_newer_forced_checkpoint():
    """Stopping with a savepoint stops periodic checkpoints first; a forced checkpoint
    asked for meanwhile (`sparkpoint checkpoint`) completes first and must not abort
    the stop's savepoint."""
    h = _harness(max_concurrent=1)
    h.coordinator.start_scheduler()
    h.coordinator.stop_scheduler()
    stop = h.coordinator.trigger_savepoint(terminate=True)
    forced = h.trigger(forced=True)
    h.ack_all(2)
    assert forced.result(0).checkpoint_id == 2
    assert not stop.done()
    h.ack_all(1)
    assert stop.result(0).checkpoint_id == 1
    assert h.gateway.aborted_ids == []
    assert h.gateway.notified == [2, 1]


def test_a_subsumed_decline_does_not_abort_a_savepoint():
    """A runtime that carries several barriers in one epoch declines the older
    checkpoints as SUBSUMED; a savepoint it is handed must not end that way."""
    h = _harness(max_concurrent=10)
    savepoint = h.coordinator.trigger_savepoint()
    assert h.coordinator.decline(1, "job", R.SUBSUMED) is False
    assert h.coordinator.pending_checkpoint_ids() == [1]
    assert not savepoint.done() and h.gateway.aborted_ids == []
    h.ack_all(1)
    assert savepoint.result(0).properties.savepoint


def test_a_savepoint_is_still_aborted_by_a_real_decline():
    h = _harness()
    savepoint = h.coordinator.trigger_savepoint()
    assert h.coordinator.decline(1, "state:count/0", R.TASK_ASYNC_FAILURE) is True
    assert failure_reason(savepoint) is R.TASK_ASYNC_FAILURE


def test_a_completed_savepoint_does_not_subsume_an_older_pending_checkpoint():
    """A savepoint is not what a failover restores from, so an older checkpoint still
    in flight is still worth completing (Flink: only checkpoints drop older pending
    ones)."""
    h = _harness(max_concurrent=10)
    checkpoint = h.trigger()
    savepoint = h.coordinator.trigger_savepoint()
    h.ack_all(2)
    assert savepoint.result(0).checkpoint_id == 2
    assert h.coordinator.pending_checkpoint_ids() == [1]
    h.ack_all(1)
    assert checkpoint.result(0).checkpoint_id == 1
    assert _retained(h) == [1]


def test_savepoints_are_not_added_to_the_completed_checkpoint_store():
    h = _harness(num_retained=3)
    h.complete(h.trigger())
    for _ in range(2):
        h.coordinator.trigger_savepoint()
        h.ack_all(h.gateway.triggered_ids[-1])
    h.complete(h.trigger())
    assert _retained(h) == [1, 4]
    assert h.coordinator.completed_store.latest().checkpoint_id == 4
    assert sorted(data.checkpoint_id for data in h.storage.savepoints.values()) == [2, 3]


@pytest.mark.parametrize("num_retained", [1, 3])
def test_savepoints_in_a_row_never_push_a_checkpoint_out_of_retention(num_retained):
    """With retain 1, one savepoint; at the default of 3, three in a row: the job's
    checkpoint stays, and a failover (a new coordinator over the same storage) finds it."""
    h = _harness(num_retained=num_retained)
    h.complete(h.trigger())
    for _ in range(num_retained):
        h.coordinator.trigger_savepoint()
        h.ack_all(h.gateway.triggered_ids[-1])
    assert h.storage.discarded_completed == []
    assert sorted(h.storage.metadata) == [1]
    assert _retained(h) == [1]

    config = CheckpointCoordinatorConfig(interval_ms=1000, num_retained=num_retained)
    after_failover = CheckpointCoordinator("orders", config, ManualScheduler(), InMemoryIdCounter(), h.storage,
                                           RecordingGateway())
    latest = after_failover.restore_latest()
    assert latest is not None and latest.checkpoint_id == 1


def test_a_savepoint_never_causes_a_retained_checkpoint_to_be_deleted_later():
    """The next checkpoint after savepoints pushes out only what checkpoints pushed out."""
    h = _harness(num_retained=2)
    h.complete(h.trigger())
    h.coordinator.trigger_savepoint()
    h.ack_all(2)
    h.complete(h.trigger())
    assert h.storage.discarded_completed == []
    assert _retained(h) == [1, 3]
    h.complete(h.trigger())
    assert [cid for cid, _ in h.storage.discarded_completed] == [1]
    assert _retained(h) == [3, 4]


def test_concurrent_savepoints_are_not_limited_by_max_concurrent():
    """Flink's testConcurrentSavepoints: with one concurrent checkpoint allowed, five
    savepoints are all in flight at once and all complete, in any order."""
    h = _harness(max_concurrent=1)
    savepoints = [h.coordinator.trigger_savepoint(f"mem://sp/{n}") for n in range(5)]
    assert h.coordinator.pending_checkpoint_ids() == [1, 2, 3, 4, 5]
    for checkpoint_id in (5, 3, 1, 4, 2):
        h.ack_all(checkpoint_id)
    assert [f.result(0).checkpoint_id for f in savepoints] == [1, 2, 3, 4, 5]
    assert sorted(h.storage.savepoints) == [f"mem://sp/{n}" for n in range(5)]
    assert _retained(h) == [] and h.failures() == {}
