"""Every failure reason is produced by the coordinator in at least one scenario, and
every produced failure is logged, counted in metrics, and (if not a "not now") alarmed."""

from __future__ import annotations

import threading
from typing import Callable

import pytest
from checkpoint_fakes import WAIT_S, RaisingIdCounter, StallingStorage
from checkpoint_support import Harness, make_harness

from sparkpoint.checkpoint import CheckpointFailureReason as R
from sparkpoint.errors import LeaseLostError, StorageError
from tests.memory import InMemoryCheckpointStorage


def _shutdown() -> Harness:
    h = make_harness()
    h.trigger()
    h.coordinator.shutdown()
    return h


def _suspending() -> Harness:
    h = make_harness()
    h.trigger()
    h.coordinator.job_status_changed("CANCELLING")
    return h


def _periodic_off() -> Harness:
    h = make_harness()
    h.trigger(periodic=True)
    return h


def _already_queued() -> Harness:
    h = make_harness()
    h.coordinator.start_scheduler()
    h.scheduler.advance(h.scheduler.next_due_ms())
    h.scheduler.advance(1000)
    h.trigger()
    return h


def _too_many() -> Harness:
    h = make_harness()
    h.trigger()
    h.trigger()
    return h


def _min_pause() -> Harness:
    h = make_harness(min_pause_ms=100)
    h.coordinator.start_scheduler()
    h.complete(h.trigger())
    h.trigger(periodic=True)  # the min pause applies to periodic triggers only
    return h


def _not_running() -> Harness:
    h = make_harness()
    h.gateway.not_ready_ids = ["source:numbers"]
    h.trigger()
    return h


def _id_collision() -> Harness:
    storage = InMemoryCheckpointStorage(report_highest_id=False)
    storage.seed_collision(range(1, 100))
    h = make_harness(storage=storage)
    h.trigger()
    return h


def _io_exception() -> Harness:
    h = make_harness()
    h.ids.fail_next()
    h.trigger()
    return h


def _trigger_failed() -> Harness:
    h = make_harness()
    h.gateway.fail_trigger = RuntimeError("no epoch loop")
    h.trigger()
    return h


def _expired_in_storage() -> Harness:
    """A trigger stalled in storage past the timeout."""
    storage = StallingStorage()
    h = make_harness(storage=storage, timeout_ms=100)
    gate = storage.stall("initialize_location")
    thread = threading.Thread(target=h.trigger, daemon=True)
    thread.start()
    assert gate.entered.wait(WAIT_S)
    h.scheduler.advance(100)
    gate.open()
    thread.join(WAIT_S)
    return h


def _declined(reason: R) -> Callable[[], Harness]:
    def scenario() -> Harness:
        h = make_harness()
        h.trigger()
        h.coordinator.decline(1, "state:count/0", reason, OSError("boom"))
        return h
    return scenario


def _expired() -> Harness:
    h = make_harness(timeout_ms=100)
    h.trigger()
    h.scheduler.advance(100)
    return h


def _finalize_failed() -> Harness:
    h = make_harness()
    h.storage.fail("commit_metadata", StorageError("io"))
    h.trigger()
    h.ack_all(1)
    return h


def _subsumed() -> Harness:
    h = make_harness(max_concurrent=2)
    h.trigger()
    h.trigger()
    h.ack_all(2)
    return h


def _lease_lost() -> Harness:
    h = make_harness()
    h.storage.fail("commit_metadata", LeaseLostError("fenced"))
    h.trigger()
    h.ack_all(1)
    return h


SCENARIOS: dict[R, Callable[[], Harness]] = {
    R.COORDINATOR_SHUTDOWN: _shutdown,
    R.COORDINATOR_SUSPENDING: _suspending,
    R.PERIODIC_SCHEDULER_SHUTDOWN: _periodic_off,
    R.ALREADY_QUEUED: _already_queued,
    R.TOO_MANY_CONCURRENT: _too_many,
    R.MINIMUM_TIME_BETWEEN_CHECKPOINTS: _min_pause,
    R.NOT_ALL_REQUIRED_TASKS_RUNNING: _not_running,
    R.ID_COLLISION: _id_collision,
    R.IO_EXCEPTION: _io_exception,
    R.TRIGGER_FAILED: _trigger_failed,
    R.TASK_NOT_READY: _declined(R.TASK_NOT_READY),
    R.TASK_CLOSING: _declined(R.TASK_CLOSING),
    R.TASK_FAILURE: _declined(R.TASK_FAILURE),
    R.TASK_SYNC_FAILURE: _declined(R.TASK_SYNC_FAILURE),
    R.TASK_ASYNC_FAILURE: _declined(R.TASK_ASYNC_FAILURE),
    R.DECLINED_BY_TASK: _declined(R.DECLINED_BY_TASK),
    R.EXPIRED: _expired,
    R.FINALIZE_FAILED: _finalize_failed,
    R.SUBSUMED: _subsumed,
    R.LEASE_LOST: _lease_lost,
}


def _io_exception_unexpected_error() -> Harness:
    """Not a StorageError: still typed."""
    ids = RaisingIdCounter()
    ids.error = RuntimeError("bug")
    h = make_harness(ids=ids)
    h.trigger()
    return h


def _trigger_failed_asking_the_gateway() -> Harness:
    h = make_harness()

    def broken() -> list[str]:
        raise RuntimeError("gone")

    h.gateway.participants = broken
    h.trigger()
    return h


def _suspended_before_metadata() -> Harness:
    """Fully acknowledged, but suspended before its _metadata."""
    h = make_harness()
    h.gateway.on_trigger = lambda call: h.coordinator.suspend_and_settle(1.0)
    h.trigger()
    h.ack_all(1)
    return h


def _refused_while_suspended() -> Harness:
    h = make_harness()
    h.coordinator.suspend_and_settle(1.0)
    h.trigger(forced=True)
    return h


# More than one path produces these reasons; each path is checked the same way.
EXTRA_PATHS: list[tuple[R, Callable[[], Harness]]] = [
    (R.EXPIRED, _expired_in_storage),
    (R.IO_EXCEPTION, _io_exception_unexpected_error),
    (R.TRIGGER_FAILED, _trigger_failed_asking_the_gateway),
    (R.COORDINATOR_SUSPENDING, _suspended_before_metadata),
    (R.COORDINATOR_SUSPENDING, _refused_while_suspended),
]
PATHS = list(SCENARIOS.items()) + EXTRA_PATHS
# Refused before an id was assigned, for a reason that is not pre-flight when it aborts a
# running checkpoint: "not now", so no alarm (docs/failure-reasons.md: "if pending").
REFUSED_WITHOUT_ID = {_refused_while_suspended}


def test_every_reason_has_a_scenario():
    assert set(SCENARIOS) == set(R)


@pytest.mark.parametrize("reason, scenario", PATHS, ids=[f"{r.name}-{f.__name__.strip('_')}" for r, f in PATHS])
def test_the_coordinator_produces_the_reason_and_reports_it(reason: R, scenario, caplog):
    caplog.set_level("DEBUG", logger="sparkpoint.checkpoint")
    h = scenario()
    assert reason in h.reasons_seen()
    assert reason.name in caplog.text
    assert any(reason.action in r.getMessage() for r in caplog.records), "the log says what to do"
    alarmed = [e for e in h.events if e.reason is reason]
    if (reason.preflight and not reason.counted and reason is not R.ID_COLLISION) \
            or scenario in REFUSED_WITHOUT_ID:
        assert alarmed == []  # "not now": logged and counted in metrics only
    else:
        assert alarmed, f"{reason.name} must raise an alarm event"
        assert all(e.counted == reason.counted for e in alarmed)
