"""The coordinator under real threads: a production scheduler and participants that
acknowledge from a thread pool. Guards against deadlocks and out-of-order completion."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from checkpoint_fakes import WAIT_S, Gate, RaisingIdCounter, StallingStorage, wait_until
from checkpoint_support import PARTICIPANTS, failure_reason, handle_for, make_harness

from sparkpoint.checkpoint import (
    AckResult,
    CheckpointCoordinator,
    CheckpointCoordinatorConfig,
    CheckpointFailureReason as R,
    CheckpointsStillFinalizingError,
    ThreadScheduler,
)
from tests.memory import InMemoryCheckpointStorage, InMemoryIdCounter, RecordingGateway


def test_checkpoints_complete_in_id_order_with_acks_from_many_threads():
    scheduler = ThreadScheduler()
    pool = ThreadPoolExecutor(max_workers=4)
    storage = InMemoryCheckpointStorage()
    gateway = RecordingGateway(participant_ids=list(PARTICIPANTS))
    config = CheckpointCoordinatorConfig(interval_ms=2, timeout_ms=5000, max_concurrent=3, num_retained=2)
    failed_jobs: list = []
    coordinator = CheckpointCoordinator("orders", config, scheduler, InMemoryIdCounter(), storage, gateway,
                                        fail_job=lambda r, e: failed_jobs.append((r, e)))
    enough = threading.Event()

    def on_trigger(call) -> None:
        for participant in PARTICIPANTS:
            pool.submit(coordinator.acknowledge, call.checkpoint_id, participant,
                        handle_for(call.checkpoint_id, participant))

    def on_notify(checkpoint_id: int, data) -> None:
        gateway.notified.append(checkpoint_id)
        if len(gateway.notified) >= 20:
            enough.set()

    gateway.on_trigger = on_trigger
    gateway.notify_complete = on_notify
    try:
        coordinator.start_scheduler()
        assert enough.wait(10), "checkpoints stopped completing (deadlock?)"
    finally:
        coordinator.shutdown()
        scheduler.shutdown()
        pool.shutdown(wait=True)

    notified = list(gateway.notified)
    assert notified == sorted(notified) and len(set(notified)) == len(notified)
    assert failed_jobs == []
    assert all(cid in storage.metadata or any(d == cid for d, _ in storage.discarded_completed)
               for cid in notified)
    assert coordinator.failure_manager.consecutive_failures == 0


def test_expiry_of_a_checkpoint_fires_while_a_periodic_trigger_is_stalled_in_storage():
    """Checkpoint 1 is running, the periodic
    trigger of checkpoint 2 hangs in storage on a timer, and checkpoint 1 must still
    expire on time (it used to wait until the stall ended)."""
    scheduler = ThreadScheduler()
    storage = StallingStorage()
    gateway = RecordingGateway(participant_ids=list(PARTICIPANTS))
    config = CheckpointCoordinatorConfig(interval_ms=200, min_pause_ms=150, timeout_ms=300, max_concurrent=2)
    coordinator = CheckpointCoordinator("orders", config, scheduler, InMemoryIdCounter(), storage, gateway)
    expired = threading.Event()
    coordinator.alarms.register(lambda e: e.checkpoint_id == 1 and e.reason is R.EXPIRED and expired.set())
    gate = storage.stall("initialize_location")
    try:
        coordinator.start_scheduler()  # first periodic trigger in 150..200 ms
        gate.open()
        first = coordinator.trigger_checkpoint()  # checkpoint 1, expires at 300 ms
        gate = storage.stall("initialize_location")
        assert gate.entered.wait(WAIT_S), "the periodic trigger did not run"
        assert expired.wait(WAIT_S), "checkpoint 1 did not expire while a trigger was stalled"
        assert failure_reason(first) is R.EXPIRED
        assert gateway.triggered_ids == [1]
    finally:
        gate.open()
        coordinator.shutdown()
        scheduler.shutdown()


# ---------------------------------------------------------------- finalizing while a failover settles
def _finalizing_harness():
    storage = StallingStorage()
    h = make_harness(storage=storage, max_concurrent=2)
    h.coordinator.start_scheduler()
    return h, storage


def _in_thread(fn, *args):
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_suspend_and_settle_waits_for_a_finalization_already_writing_metadata():
    """The last ack has arrived, so checkpoint 1 has left the pending set and is
    writing `_metadata`. A failover's suspend_and_settle must not return before that
    finalization is over (metadata written, completed store updated, participants
    notified), so restore sees it and no commit runs behind restore's back."""
    h, storage = _finalizing_harness()
    future = h.trigger()
    gate = storage.stall("commit_metadata")
    acker, _ = _in_thread(h.ack_all, 1)
    assert gate.entered.wait(WAIT_S)

    settler, settled = _in_thread(h.coordinator.suspend_and_settle, WAIT_S)
    wait_until(lambda: h.coordinator.is_suspended, "suspended")
    settler.join(0.1)
    assert settler.is_alive(), "suspend_and_settle returned while checkpoint 1 was finalizing"
    gate.open()
    settler.join(WAIT_S)
    acker.join(WAIT_S)
    assert not settler.is_alive() and "error" not in settled
    assert future.result(0).checkpoint_id == 1
    assert h.coordinator.completed_store.latest().checkpoint_id == 1
    assert h.gateway.notified == [1]
    assert not h.coordinator.periodic_scheduling


def test_suspend_and_settle_aborts_a_finalization_that_has_not_written_metadata():
    """Checkpoint 2 is fully acknowledged but waits for checkpoint 1's
    finalization; once suspended, it is aborted before its `_metadata` (not counted) and
    nothing completes until the scheduler starts again."""
    h, storage = _finalizing_harness()
    first, second = h.trigger(), h.trigger()
    gate = storage.stall("commit_metadata")
    acker1, _ = _in_thread(h.ack_all, 1)
    assert gate.entered.wait(WAIT_S)
    acker2, _ = _in_thread(h.ack_all, 2)
    wait_until(lambda: h.coordinator.pending_checkpoint_ids() == [], "checkpoint 2 waits to finalize")

    settler, settled = _in_thread(h.coordinator.suspend_and_settle, WAIT_S)
    wait_until(lambda: h.coordinator.is_suspended, "suspended")
    gate.open()
    for t in (settler, acker1, acker2):
        t.join(WAIT_S)
        assert not t.is_alive()
    assert "error" not in settled
    assert first.result(0).checkpoint_id == 1
    assert failure_reason(second) is R.COORDINATOR_SUSPENDING
    assert sorted(storage.metadata) == [1]
    assert h.gateway.notified == [1]
    assert h.coordinator.failure_manager.consecutive_failures == 0
    assert h.coordinator.stats.snapshot()["counted_failed"] == 0

    # nothing can complete until the scheduler is started again
    assert failure_reason(h.trigger(forced=True)) is R.COORDINATOR_SUSPENDING
    h.coordinator.job_status_changed("RUNNING")
    assert h.complete(h.trigger()).checkpoint_id == 3


def test_suspend_and_settle_aborts_pending_checkpoints_and_returns_at_once_when_idle(h):
    future = h.trigger()
    h.coordinator.suspend_and_settle(1.0)
    assert failure_reason(future) is R.COORDINATOR_SUSPENDING
    assert h.gateway.aborted_ids == [1]
    assert h.ack(1, "job") is AckResult.DISCARDED
    assert h.coordinator.failure_manager.consecutive_failures == 0


def test_suspend_and_settle_raises_a_typed_error_when_a_finalization_does_not_finish():
    h, storage = _finalizing_harness()
    h.trigger()
    gate = storage.stall("commit_metadata")
    acker, _ = _in_thread(h.ack_all, 1)
    assert gate.entered.wait(WAIT_S)
    try:
        with pytest.raises(CheckpointsStillFinalizingError) as raised:
            h.coordinator.suspend_and_settle(0.2)
        assert raised.value.checkpoint_ids == (1,)
        assert "1" in str(raised.value)
    finally:
        gate.open()
        acker.join(WAIT_S)


def test_suspend_and_settle_from_inside_a_finalization_does_not_wait_for_itself():
    """A runtime that fails over from a callback of the finalizing thread (e.g. the
    fail-job callback after FINALIZE_FAILED, or notify_complete) must not deadlock."""
    h, _ = _finalizing_harness()
    calls = []

    def notify(checkpoint_id, data):
        h.coordinator.suspend_and_settle(1.0)
        calls.append(checkpoint_id)

    h.gateway.notify_complete = notify
    future = h.trigger()
    h.ack_all(1)
    assert future.result(0).checkpoint_id == 1
    assert calls == [1]


# ---------------------------------------------------------------- a stalled trigger
def test_a_trigger_stalled_in_storage_expires_alone_and_the_next_trigger_completes():
    """One storage call hangs while creating chk-1/. Its trigger expires at its deadline
    (one counted failure); the next trigger must not wait behind it for its turn - it
    gets id 2, reaches the participants and completes while the first call still hangs.
    When storage finally answers, chk-1 is never started and its directory is removed."""
    storage = StallingStorage()
    h = make_harness(storage=storage, timeout_ms=1_000, tolerable_failed=1)
    gate = storage.stall("initialize_location")
    stalled, stalled_result = _in_thread(h.trigger)
    try:
        assert gate.entered.wait(WAIT_S)
        h.scheduler.advance(1_000)
        assert h.failures() == {"EXPIRED": 1}

        following, following_result = _in_thread(h.trigger)
        wait_until(lambda: h.gateway.triggered_ids == [2],
                   "the next trigger reached the participants while the first hangs in storage")
        following.join(WAIT_S)
        assert h.ack_all(2) == [AckResult.SUCCESS] * 3
        assert following_result["value"].result(0).checkpoint_id == 2
        assert h.failures() == {"EXPIRED": 1}
        assert h.coordinator.failure_manager.consecutive_failures == 0
        assert h.failed_jobs == []
    finally:
        gate.open()
        stalled.join(WAIT_S)
    assert failure_reason(stalled_result["value"]) is R.EXPIRED
    assert h.gateway.triggered_ids == [2]
    assert 1 not in storage.directories and 1 in storage.discarded_locations
    assert h.failures() == {"EXPIRED": 1}


def test_a_trigger_stalled_in_the_id_counter_takes_no_id_once_it_expired():
    """The stall is in the id counter: the next trigger takes id 1 and completes; the
    stalled one, answered after its deadline, creates no directory for the id it got."""
    ids = RaisingIdCounter()
    storage = StallingStorage()
    h = make_harness(storage=storage, ids=ids, timeout_ms=1_000)
    ids.gate = gate = Gate()
    stalled, stalled_result = _in_thread(h.trigger)
    try:
        assert gate.entered.wait(WAIT_S)
        h.scheduler.advance(1_000)
        following, following_result = _in_thread(h.trigger)
        wait_until(lambda: h.gateway.triggered_ids == [1], "the next trigger took id 1 and started")
        following.join(WAIT_S)
        h.ack_all(1)
        assert following_result["value"].result(0).checkpoint_id == 1
    finally:
        gate.open()
        stalled.join(WAIT_S)
    assert failure_reason(stalled_result["value"]) is R.EXPIRED
    assert [e for e in storage.events if e[0] == "initialize_location"] == [("initialize_location", 1)]
    assert h.gateway.triggered_ids == [1]
