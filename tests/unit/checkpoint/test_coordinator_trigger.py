"""Triggering: Flink's pre-checks in order, ids, and what a refused trigger leaves behind."""

from __future__ import annotations

import random
import threading

import pytest
from checkpoint_fakes import WAIT_S, Gate, RaisingIdCounter, StallingStorage, wait_until
from checkpoint_support import failure_reason, make_harness

from sparkpoint.checkpoint import (
    CheckpointCoordinator,
    CheckpointCoordinatorConfig,
    CheckpointFailureReason as R,
    ManualScheduler,
)
from sparkpoint.errors import StorageError
from tests.memory import InMemoryCheckpointStorage, InMemoryIdCounter, RecordingGateway


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


def test_manual_trigger_inside_the_min_pause_runs():
    """Like Flink, the min pause applies to periodic triggers only; a manual
    (non-forced) request right after a completion starts at once."""
    h = make_harness(min_pause_ms=500)
    h.complete(h.trigger())
    second = h.trigger()
    assert h.gateway.triggered_ids == [1, 2]
    assert h.complete(second).checkpoint_id == 2
    assert h.failures() == {}
    assert failure_reason(h.trigger(periodic=True)) is R.PERIODIC_SCHEDULER_SHUTDOWN
    h.coordinator.start_scheduler()
    assert failure_reason(h.trigger(periodic=True)) is R.MINIMUM_TIME_BETWEEN_CHECKPOINTS


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


# ---------------------------------------------------------------- any trigger error is typed
@pytest.mark.parametrize("where, error", [
    ("id_counter", RuntimeError("bug in the id counter")),
    ("id_counter", OSError(5, "Input/output error")),
    ("initialize_location", ValueError("bad path")),
    ("initialize_location", PermissionError("read-only file system")),
], ids=["counter-RuntimeError", "counter-OSError", "location-ValueError", "location-PermissionError"])
def test_any_error_from_the_id_counter_or_storage_fails_the_trigger_as_a_typed_io_exception(where, error, caplog):
    """Not only StorageError - any exception from the id counter or storage
    while starting a checkpoint fails that trigger with IO_EXCEPTION, seen by the failure
    manager, stats and alarms, instead of escaping trigger_checkpoint raw."""
    ids, storage = RaisingIdCounter(), StallingStorage()
    h = make_harness(ids=ids, storage=storage, tolerable_failed=0)
    if where == "id_counter":
        ids.error = error
    else:
        storage.raise_on("initialize_location", error)
    future = h.trigger()
    assert failure_reason(future) is R.IO_EXCEPTION
    assert h.failures() == {"IO_EXCEPTION": 1}
    assert h.coordinator.stats.snapshot()["counted_failed"] == 1
    assert [(e.reason, e.counted) for e in h.events] == [(R.IO_EXCEPTION, True)]
    assert [reason for reason, _ in h.failed_jobs] == [R.IO_EXCEPTION]  # past tolerance 0
    assert type(error).__name__ in caplog.text and R.IO_EXCEPTION.action in caplog.text
    assert h.gateway.triggered_ids == []
    storage.raise_on("initialize_location", None)
    assert h.complete(h.trigger()).checkpoint_id >= 1


def test_error_asking_the_gateway_who_participates_fails_the_trigger_as_trigger_failed(h):
    """The gateway side of the same path: nothing escapes trigger_checkpoint."""
    def broken() -> list[str]:
        raise RuntimeError("executor registry gone")

    h.gateway.not_ready = broken
    future = h.trigger()
    assert failure_reason(future) is R.TRIGGER_FAILED
    assert h.coordinator.failure_manager.consecutive_failures == 1
    assert [e.reason for e in h.events] == [R.TRIGGER_FAILED]
    assert h.ids.get() == 1


# ---------------------------------------------------------------- a trigger stalled in storage
def _trigger_in_thread(h, **kwargs):
    result: dict = {}

    def run() -> None:
        result["future"] = h.coordinator.trigger_checkpoint(**kwargs)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


@pytest.mark.parametrize("stalled", ["id_counter", "initialize_location"])
def test_trigger_stalled_in_storage_expires_and_never_reaches_the_participants(stalled):
    """The timeout is armed before any storage work. A trigger whose id
    counter or directory creation hangs past the timeout fails EXPIRED (counted, alarmed)
    at the deadline, while storage is still hung; when storage finally answers, the
    barrier is never sent and the unused directory is removed."""
    ids, storage = RaisingIdCounter(), StallingStorage()
    h = make_harness(ids=ids, storage=storage, timeout_ms=5000)
    if stalled == "id_counter":
        gate = ids.gate = Gate()
    else:
        gate = storage.stall("initialize_location")
    thread, result = _trigger_in_thread(h)
    assert gate.entered.wait(WAIT_S)

    h.scheduler.advance(4999)
    assert h.events == []
    h.scheduler.advance(1)  # the deadline passes while storage is still hung
    assert [(e.reason, e.counted) for e in h.events] == [(R.EXPIRED, True)]
    assert h.coordinator.failure_manager.consecutive_failures == 1
    assert "storage" in h.events[0].error_summary

    gate.open()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert failure_reason(result["future"]) is R.EXPIRED
    assert h.gateway.triggers == []  # never reached the participants
    assert h.gateway.aborts == []  # nobody was asked, nobody to stop
    assert h.storage.directories == set()  # the late directory is removed again
    assert h.coordinator.pending_checkpoint_ids() == []
    assert len(h.events) == 1  # expired once, not failed a second time
    assert h.complete(h.trigger()).checkpoint_id == 2


def test_a_stalled_trigger_counts_as_in_flight_so_triggers_do_not_pile_up_behind_it():
    """(Flink: one trigger at a time, further requests queued): while a trigger
    waits for storage, a periodic trigger is queued, a manual one refused as too many."""
    storage = StallingStorage()
    h = make_harness(storage=storage, max_concurrent=1, timeout_ms=5000)
    h.coordinator.start_scheduler()
    gate = storage.stall("initialize_location")
    thread, result = _trigger_in_thread(h)
    assert gate.entered.wait(WAIT_S)
    assert failure_reason(h.trigger()) is R.TOO_MANY_CONCURRENT
    h.scheduler.advance(1000)  # the periodic trigger finds the stalled one in flight
    assert h.coordinator.trigger_request_queued
    gate.open()
    thread.join(WAIT_S)
    assert h.gateway.triggered_ids == [1]
    h.ack_all(1)
    h.scheduler.advance(0)  # the queued periodic request runs once the first one ended
    assert h.gateway.triggered_ids == [1, 2]


def test_a_trigger_waiting_behind_a_stalled_trigger_returns_at_its_deadline():
    """A forced trigger queued behind a hung storage call is not stuck with
    it: its caller gets an EXPIRED future at the deadline, and it never starts."""
    storage = StallingStorage()
    h = make_harness(storage=storage, timeout_ms=5000)
    gate = storage.stall("initialize_location")
    first, first_result = _trigger_in_thread(h)
    assert gate.entered.wait(WAIT_S)
    second, second_result = _trigger_in_thread(h, forced=True)
    wait_until(lambda: h.scheduler.pending_timers() == 2, "the second trigger armed its timeout")
    second.join(0.1)
    assert second.is_alive()  # waits for the stalled trigger's turn
    h.scheduler.advance(5000)
    second.join(WAIT_S)
    assert not second.is_alive(), "the waiting trigger must give up at its deadline"
    assert failure_reason(second_result["future"]) is R.EXPIRED
    gate.open()
    first.join(WAIT_S)
    assert failure_reason(first_result["future"]) is R.EXPIRED
    assert h.gateway.triggers == []
    assert h.ids.get() == 2  # the waiting trigger never took an id


def test_stopping_the_scheduler_aborts_a_trigger_stalled_in_storage():
    """A trigger still in storage when the job leaves RUNNING is aborted
    (not counted) and never reaches the participants."""
    storage = StallingStorage()
    h = make_harness(storage=storage)
    gate = storage.stall("initialize_location")
    thread, result = _trigger_in_thread(h)
    assert gate.entered.wait(WAIT_S)
    h.coordinator.stop_scheduler()
    gate.open()
    thread.join(WAIT_S)
    assert failure_reason(result["future"]) is R.COORDINATOR_SUSPENDING
    assert h.gateway.triggers == []
    assert h.coordinator.failure_manager.consecutive_failures == 0
    assert h.storage.directories == set()


def test_a_periodic_request_queued_behind_a_trigger_refused_as_not_ready_still_runs():
    """A trigger holds a place among those in flight from its pre-checks on; when it
    ends without starting (participants not ready), a periodic request queued behind it
    in the meantime must still run."""
    h = make_harness(max_concurrent=1)
    h.coordinator.start_scheduler()
    first_due = h.scheduler.next_due_ms()
    asked = []

    def not_ready() -> list[str]:
        asked.append(1)
        if len(asked) == 1:
            h.scheduler.advance(first_due)  # the periodic timer fires meanwhile: queued
            assert h.coordinator.trigger_request_queued
            return ["state:count/0"]
        return []

    h.gateway.not_ready = not_ready
    assert failure_reason(h.trigger()) is R.NOT_ALL_REQUIRED_TASKS_RUNNING
    h.scheduler.advance(0)  # the queued periodic request runs now
    assert h.gateway.triggered_ids == [1]


def test_abort_never_reaches_the_runtime_before_the_trigger_it_cancels():
    """The job leaves RUNNING while `gateway.trigger` is being called for checkpoint 1:
    the checkpoint is aborted at once, but `gateway.abort(1)` waits until `trigger(1)`
    returned, so the runtime never sees abort before trigger; and suspend_and_settle
    does not return while the barrier is being handed over."""
    h = make_harness()
    entered, release = threading.Event(), threading.Event()
    order: list[str] = []

    def on_trigger(call) -> None:
        entered.set()
        assert release.wait(WAIT_S)
        order.append(f"trigger {call.checkpoint_id}")

    h.gateway.on_trigger = on_trigger
    real_abort = h.gateway.abort
    h.gateway.abort = lambda cid, reason: (order.append(f"abort {cid}"), real_abort(cid, reason))[1]
    thread, result = _trigger_in_thread(h)
    assert entered.wait(WAIT_S)
    settler = threading.Thread(target=h.coordinator.suspend_and_settle, args=(WAIT_S,), daemon=True)
    settler.start()
    wait_until(lambda: h.coordinator.is_suspended, "suspended")
    settler.join(0.1)
    assert settler.is_alive()
    assert order == []
    release.set()
    thread.join(WAIT_S)
    settler.join(WAIT_S)
    assert not settler.is_alive()
    assert order == ["trigger 1", "abort 1"]
    assert failure_reason(result["future"]) is R.COORDINATOR_SUSPENDING
