"""Scheduler start/stop by job status, shutdown, restore."""

from __future__ import annotations

import pytest
from checkpoint_support import PARTICIPANTS, failure_reason, make_harness

from sparkpoint.checkpoint import (
    AckResult,
    CheckpointFailureReason as R,
    CompletedCheckpointData,
    CoordinatorShutDownError,
)
from sparkpoint.errors import StorageError
from tests.memory import InMemoryCheckpointStorage


def completed(checkpoint_id: int) -> CompletedCheckpointData:
    return CompletedCheckpointData("orders", checkpoint_id, checkpoint_id * 10, checkpoint_id * 10 + 5,
                                   {p: {"participant": p} for p in PARTICIPANTS})


def test_running_job_checkpoints_every_interval():
    h = make_harness(interval_ms=1000)
    h.coordinator.job_status_changed("RUNNING")
    h.scheduler.advance(h.scheduler.next_due_ms())
    for expected in (1, 2, 3):
        assert h.gateway.triggered_ids[-1] == expected
        h.ack_all(expected)
        h.scheduler.advance(1000)
    assert h.gateway.triggered_ids == [1, 2, 3, 4]


def test_job_leaving_running_stops_triggers_and_aborts_pending_uncounted():
    h = make_harness(interval_ms=1000, tolerable_failed=0)
    h.coordinator.job_status_changed("RUNNING")
    h.scheduler.advance(h.scheduler.next_due_ms())
    assert h.coordinator.pending_checkpoint_ids() == [1]
    h.coordinator.job_status_changed("RESTARTING")
    assert h.coordinator.pending_checkpoint_ids() == []
    assert [(e.checkpoint_id, e.reason, e.counted) for e in h.events] == [(1, R.COORDINATOR_SUSPENDING, False)]
    assert h.failed_jobs == []
    assert h.gateway.aborted_ids == [1]
    h.scheduler.advance(10_000)
    assert h.gateway.triggered_ids == [1]
    h.coordinator.job_status_changed("RUNNING")
    h.scheduler.advance(1000)
    assert h.gateway.triggered_ids == [1, 2]


def test_stopping_periodic_triggers_lets_the_checkpoint_in_flight_complete():
    """The end of a bounded input: no new periodic checkpoint, and the one in flight is
    not aborted; it completes, and the forced final one after it."""
    h = make_harness(interval_ms=1000)
    h.coordinator.job_status_changed("RUNNING")
    h.scheduler.advance(h.scheduler.next_due_ms())
    assert h.coordinator.checkpoints_in_flight()
    h.coordinator.stop_periodic_triggers()
    h.scheduler.advance(5000)  # five intervals, within the checkpoint timeout
    assert h.gateway.triggered_ids == [1] and h.gateway.aborted_ids == []
    h.ack_all(1)
    assert not h.coordinator.checkpoints_in_flight()
    final = h.trigger(forced=True)
    h.ack_all(2)
    assert final.result(0).checkpoint_id == 2
    assert h.events == [] and h.gateway.notified == [1, 2]


def test_starting_twice_keeps_one_periodic_timer():
    h = make_harness(interval_ms=1000, timeout_ms=100_000, max_concurrent=10)
    h.coordinator.start_scheduler()
    h.coordinator.start_scheduler()
    h.scheduler.advance(h.scheduler.next_due_ms())
    h.scheduler.advance(3000)
    assert h.gateway.triggered_ids == [1, 2, 3, 4]


def test_shutdown_aborts_pending_is_idempotent_and_stops_the_id_counter(h):
    future = h.trigger()
    h.coordinator.shutdown()
    h.coordinator.shutdown()
    assert failure_reason(future) is R.COORDINATOR_SHUTDOWN
    assert h.ids.stopped
    assert [e.reason for e in h.events] == [R.COORDINATOR_SHUTDOWN]
    assert h.coordinator.failure_manager.consecutive_failures == 0
    with pytest.raises(CoordinatorShutDownError):
        h.coordinator.start_scheduler()
    h.coordinator.job_status_changed("RUNNING")  # ignored after shutdown
    assert not h.coordinator.periodic_scheduling


def test_restore_returns_the_latest_and_never_reuses_an_id():
    """Seed 002: after a restart ids continue past every chk-<id> ever written."""
    storage = InMemoryCheckpointStorage(completed=[completed(3), completed(5)])
    storage.seed_collision({9})  # a crashed attempt without _metadata
    h = make_harness(storage=storage)
    latest = h.coordinator.restore_latest()
    assert latest == completed(5)
    assert [c.checkpoint_id for c in h.coordinator.completed_store.all()] == [3, 5]
    assert h.ack(4, "job") is AckResult.DISCARDED  # older than what we restored
    h.trigger()
    assert h.gateway.triggered_ids == [10]


def test_restore_without_checkpoints_returns_none(h):
    assert h.coordinator.restore_latest() is None
    h.trigger()
    assert h.gateway.triggered_ids == [1]


def test_restore_keeps_older_checkpoints_until_the_next_completion_then_trims():
    storage = InMemoryCheckpointStorage(completed=[completed(i) for i in (1, 2, 3, 4)])
    h = make_harness(storage=storage, num_retained=2)
    h.coordinator.restore_latest()
    assert len(h.coordinator.completed_store) == 4  # fallbacks if the latest fails to restore
    h.complete(h.trigger())
    assert [c.checkpoint_id for c in h.coordinator.completed_store.all()] == [4, 5]
    assert [cid for cid, _ in storage.discarded_completed] == [1, 2, 3]


def test_restore_refuses_to_guess_when_storage_cannot_be_read():
    storage = InMemoryCheckpointStorage()
    storage.fail("load_completed", StorageError("bucket unreachable"))
    h = make_harness(storage=storage)
    with pytest.raises(StorageError):
        h.coordinator.restore_latest()


def test_a_raising_alarm_listener_breaks_nothing(h, caplog):
    def broken(event):
        raise RuntimeError("pager down")

    seen = []
    h.coordinator.alarms.register(broken)
    h.coordinator.alarms.register(seen.append)
    h.trigger()
    assert h.coordinator.decline(1, "job", R.DECLINED_BY_TASK) is True
    assert [e.reason for e in seen] == [R.DECLINED_BY_TASK]
    assert "pager down" in caplog.text
    assert h.complete(h.trigger()).checkpoint_id == 2


def test_shutdown_with_a_periodic_checkpoint_in_flight_reports_no_failed_checkpoint():
    """A clean bounded run ends with one periodic checkpoint in flight; its
    COORDINATOR_SHUTDOWN abort must not show up as a failed checkpoint anywhere the user
    looks (the progress line and the final summary print counted_failed; `failed` is in
    the summary's stats too)."""
    h = make_harness(interval_ms=1000)
    h.coordinator.start_scheduler()
    h.scheduler.advance(h.scheduler.next_due_ms())
    assert h.coordinator.pending_checkpoint_ids() == [1]
    h.coordinator.shutdown()
    snap = h.coordinator.stats.snapshot()
    assert snap["counted_failed"] == 0
    assert snap["failed"] == 0
    assert snap["aborted"] == 1  # still visible, as what it is
    assert snap["in_progress"] == 0
    assert snap["failures_by_reason"] == {"COORDINATOR_SHUTDOWN": 1}


def test_checkpoints_aborted_by_suspension_or_subsumption_are_not_failed_checkpoints():
    h = make_harness(max_concurrent=2)
    h.trigger()
    h.trigger()
    h.ack_all(2)  # subsumes 1
    h.trigger()
    h.coordinator.job_status_changed("RESTARTING")  # suspends 3
    snap = h.coordinator.stats.snapshot()
    assert (snap["failed"], snap["counted_failed"], snap["aborted"]) == (0, 0, 2)
