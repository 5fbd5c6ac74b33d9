"""Triggering: Flink's pre-checks in order, ids, and what a refused trigger leaves behind."""

from __future__ import annotations

import random

import pytest
from checkpoint_support import failure_reason, make_harness

from sparkpoint.checkpoint import (
    CheckpointCoordinator,
    CheckpointCoordinatorConfig,
    CheckpointFailureReason as R,
    ManualScheduler,
)
from sparkpoint.errors import StorageError
from sparkpoint.testing.memory import InMemoryCheckpointStorage, InMemoryIdCounter, RecordingGateway


def test_trigger_starts_a_checkpoint_and_completes_when_all_ack(h):
    future = h.trigger()
    assert h.gateway.triggered_ids == [1]
    assert not future.done()
    data = h.complete(future)
    assert data.checkpoint_id == 1
    assert set(data.handles) == set(h.gateway.participant_ids)
    assert h.storage.metadata[1] == data
    assert h.gateway.notified == [1]


def test_shut_down_coordinator_refuses_without_using_an_id(h):
    h.coordinator.shutdown()
    future = h.trigger(forced=True)
    assert failure_reason(future) is R.COORDINATOR_SHUTDOWN
    assert h.ids.get() == 1
    assert h.storage.events == []


def test_periodic_trigger_is_refused_while_scheduling_is_off_but_manual_trigger_runs(h):
    assert failure_reason(h.trigger(periodic=True)) is R.PERIODIC_SCHEDULER_SHUTDOWN
    assert h.gateway.triggered_ids == []
    h.trigger()
    assert h.gateway.triggered_ids == [1]


def test_too_many_concurrent_refuses_without_using_an_id(h):
    h.trigger()
    assert failure_reason(h.trigger()) is R.TOO_MANY_CONCURRENT
    assert h.gateway.triggered_ids == [1]
    assert h.ids.get() == 2
    assert h.events == []  # "not now" raises no alarm


def test_periodic_request_is_queued_behind_a_running_checkpoint_and_fires_after_it_completes():
    h = make_harness(interval_ms=1000, timeout_ms=60_000)
    h.coordinator.start_scheduler()
    first_due = h.scheduler.next_due_ms()
    h.scheduler.advance(first_due)
    assert h.gateway.triggered_ids == [1]

    h.scheduler.advance(1000)  # the next periodic trigger finds checkpoint 1 still running
    assert h.coordinator.trigger_request_queued
    assert h.failures() == {"TOO_MANY_CONCURRENT": 1}
    h.scheduler.advance(5000)  # the periodic timer is off while a request is queued
    assert h.gateway.triggered_ids == [1]
    assert failure_reason(h.trigger()) is R.ALREADY_QUEUED

    h.ack_all(1)
    h.scheduler.advance(0)  # the queued request fires right away
    assert h.gateway.triggered_ids == [1, 2]
    assert not h.coordinator.trigger_request_queued
    h.ack_all(2)
    h.scheduler.advance(1000)  # and the periodic rhythm resumes
    assert h.gateway.triggered_ids == [1, 2, 3]


def test_queued_request_also_fires_after_the_running_checkpoint_fails():
    h = make_harness(interval_ms=1000)
    h.coordinator.start_scheduler()
    h.scheduler.advance(h.scheduler.next_due_ms())
    h.scheduler.advance(1000)
    assert h.coordinator.trigger_request_queued
    h.coordinator.decline(1, "job", R.TASK_SYNC_FAILURE)
    h.scheduler.advance(0)
    assert h.gateway.triggered_ids == [1, 2]


def test_min_pause_moves_the_periodic_trigger_to_when_the_pause_ends():
    h = make_harness(interval_ms=1000, min_pause_ms=800)
    h.coordinator.start_scheduler()
    start = h.scheduler.next_due_ms()
    h.scheduler.advance(start)
    assert h.gateway.triggered_ids == [1]
    h.scheduler.advance(900)
    h.ack_all(1)  # completes at start + 900; the pause lasts until start + 1700
    h.scheduler.advance(100)  # periodic trigger at start + 1000: too early
    assert h.failures() == {"MINIMUM_TIME_BETWEEN_CHECKPOINTS": 1}
    assert h.gateway.triggered_ids == [1]
    h.scheduler.advance(699)
    assert h.gateway.triggered_ids == [1]
    h.scheduler.advance(1)
    assert h.gateway.triggered_ids == [1, 2]
    assert h.gateway.triggers[-1].timestamp_ms == start + 1700


def test_manual_trigger_inside_the_min_pause_is_refused():
    h = make_harness(min_pause_ms=500)
    h.complete(h.trigger())
    assert failure_reason(h.trigger()) is R.MINIMUM_TIME_BETWEEN_CHECKPOINTS
    h.scheduler.advance(500)
    h.trigger()
    assert h.gateway.triggered_ids == [1, 2]


def test_participants_not_running_refuse_the_checkpoint_without_an_id_or_an_alarm(h, caplog):
    h.gateway.not_ready_ids = ["state:count/0"]
    with caplog.at_level("INFO", logger="sparkpoint.checkpoint.coordinator"):
        future = h.trigger(forced=True)
    assert failure_reason(future) is R.NOT_ALL_REQUIRED_TASKS_RUNNING
    assert "state:count/0" in caplog.text
    assert h.ids.get() == 1
    assert h.events == []
    assert h.coordinator.failure_manager.consecutive_failures == 0


def test_forced_checkpoint_skips_the_concurrency_and_min_pause_checks():
    h = make_harness(min_pause_ms=10_000, max_concurrent=1)
    h.trigger()
    forced = h.trigger(forced=True)
    assert h.gateway.triggered_ids == [1, 2]
    assert h.gateway.triggers[-1].properties.forced
    h.ack_all(2)
    assert forced.result(timeout=0).checkpoint_id == 2
    h.trigger(forced=True)  # right after a completion, inside the min pause
    assert h.gateway.triggered_ids == [1, 2, 3]


@pytest.mark.parametrize("report_highest_id", [True, False])
def test_id_collision_skips_to_a_fresh_id_without_failing(report_highest_id):
    storage = InMemoryCheckpointStorage(report_highest_id=report_highest_id)
    storage.seed_collision({1, 2, 3})  # left behind by a crashed run whose ids were lost
    h = make_harness(storage=storage)
    data = h.complete(h.trigger())
    assert data.checkpoint_id == 4
    assert h.failures() == {}
    assert h.events == []
    assert h.coordinator.failure_manager.consecutive_failures == 0


def test_id_collision_jumps_past_the_highest_directory_when_storage_can_tell():
    storage = InMemoryCheckpointStorage()
    storage.seed_collision({1, 40})
    h = make_harness(storage=storage)
    h.trigger()
    assert h.gateway.triggered_ids == [41]


def test_too_many_collisions_fail_the_trigger_uncounted_and_the_next_one_continues():
    storage = InMemoryCheckpointStorage(report_highest_id=False)
    storage.seed_collision(range(1, 17))
    h = make_harness(storage=storage)
    future = h.trigger()
    assert failure_reason(future) is R.ID_COLLISION
    assert h.coordinator.failure_manager.consecutive_failures == 0
    assert [e.reason for e in h.events] == [R.ID_COLLISION]
    assert h.failed_jobs == []
    assert h.complete(h.trigger()).checkpoint_id == 17


def test_id_counter_failure_is_a_counted_io_exception_and_the_job_keeps_running(h):
    h.ids.fail_next()
    future = h.trigger()
    assert failure_reason(future) is R.IO_EXCEPTION
    assert h.coordinator.failure_manager.consecutive_failures == 1
    assert h.events[0].checkpoint_id is None and h.events[0].counted
    assert h.complete(h.trigger()).checkpoint_id == 1
    assert h.coordinator.failure_manager.consecutive_failures == 0


def test_storage_failure_creating_the_directory_is_a_counted_io_exception(h):
    h.storage.fail("initialize_location")
    assert failure_reason(h.trigger()) is R.IO_EXCEPTION
    assert h.events[0].checkpoint_id == 1
    assert h.gateway.triggered_ids == []
    assert h.complete(h.trigger()).checkpoint_id == 2


def test_runtime_failing_to_deliver_the_barrier_aborts_and_counts(h):
    h.gateway.fail_trigger = RuntimeError("epoch loop is gone")
    future = h.trigger()
    assert failure_reason(future) is R.TRIGGER_FAILED
    assert h.coordinator.pending_checkpoint_ids() == []
    assert h.gateway.aborted_ids == [1]
    assert h.storage.discarded_locations == [1]
    assert h.coordinator.failure_manager.consecutive_failures == 1


def test_checkpoint_without_participants_completes_at_once():
    h = make_harness(participants=[])
    assert h.trigger().result(timeout=0).checkpoint_id == 1


@pytest.mark.parametrize("seed", range(20))
def test_first_periodic_trigger_comes_after_a_random_delay_between_min_pause_and_interval(seed):
    config = CheckpointCoordinatorConfig(interval_ms=1000, min_pause_ms=300)
    scheduler = ManualScheduler()
    coordinator = CheckpointCoordinator("orders", config, scheduler, InMemoryIdCounter(),
                                        InMemoryCheckpointStorage(), RecordingGateway(),
                                        rng=random.Random(seed))
    coordinator.start_scheduler()
    assert 300 <= scheduler.next_due_ms() <= 1000


def test_trigger_after_the_storage_recovers_does_not_reuse_ids(h):
    h.storage.fail("initialize_location", StorageError("nfs timeout"))
    h.trigger()
    h.trigger()
    assert h.gateway.triggered_ids == [2]
