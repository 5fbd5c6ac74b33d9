"""Finalizing: durable first, then record, then notify, then delete what was subsumed;
and what each finalize failure means."""

from __future__ import annotations

import threading

import pytest
from checkpoint_fakes import WAIT_S, DiscardingStorage, StallingStorage, wait_until
from checkpoint_support import failure_reason, handle_for, make_harness

from sparkpoint.checkpoint import AckResult, CheckpointFailureReason as R
from sparkpoint.errors import LeaseLostError, MetadataExistsError, StorageError


def test_side_effects_happen_after_the_checkpoint_is_durable_in_order():
    h = make_harness(num_retained=1)
    h.gateway.notify_complete = lambda cid, data: h.storage.events.append(("notify_complete", cid))
    h.complete(h.trigger())
    h.scheduler.advance(10)
    h.complete(h.trigger())
    steps = [e for e in h.storage.events if e[0] != "initialize_location"]
    assert steps == [("commit_metadata", 1), ("notify_complete", 1),
                     ("commit_metadata", 2), ("notify_complete", 2), ("discard_completed", 1)]


def test_retention_discards_subsumed_checkpoints_with_the_handles_still_referenced():
    h = make_harness(num_retained=2)
    for _ in range(3):
        h.complete(h.trigger())
    assert [c.checkpoint_id for c in h.coordinator.completed_store.all()] == [2, 3]
    [(discarded_id, still_referenced)] = h.storage.discarded_completed
    assert discarded_id == 1
    expected = [handle_for(cid, p) for cid in (2, 3) for p in h.gateway.participant_ids]
    assert sorted(map(str, still_referenced)) == sorted(map(str, expected))


def test_failed_discard_of_a_subsumed_checkpoint_is_logged_not_fatal(caplog):
    h = make_harness(num_retained=1)
    h.storage.fail("discard_completed", StorageError("permission denied"))
    h.complete(h.trigger())
    h.complete(h.trigger())
    assert "could not delete subsumed checkpoint 1" in caplog.text
    assert h.coordinator.completed_store.latest().checkpoint_id == 2
    assert h.failures() == {}


def test_metadata_write_failure_is_a_counted_finalize_failure_and_the_job_continues(h):
    h.storage.fail("commit_metadata", StorageError("connection reset"))
    future = h.trigger()
    h.ack_all(1)
    assert failure_reason(future) is R.FINALIZE_FAILED
    assert h.coordinator.failure_manager.consecutive_failures == 1
    assert h.gateway.notified == []
    assert h.coordinator.completed_store.latest() is None
    assert h.storage.discarded_locations == [1]
    assert h.complete(h.trigger()).checkpoint_id == 2


def test_existing_metadata_is_never_deleted():
    """Seed 003: someone else's _metadata in our chk-<id> must survive our failure."""
    h = make_harness()
    h.storage.fail("commit_metadata", MetadataExistsError("chk-1/_metadata already exists"))
    future = h.trigger()
    h.ack_all(1)
    assert failure_reason(future) is R.FINALIZE_FAILED
    assert h.storage.discarded_locations == []
    assert h.gateway.aborted_ids == [1]


def test_lost_lease_stops_the_job_for_good_and_touches_no_storage():
    h = make_harness(max_concurrent=2)
    h.storage.fail("commit_metadata", LeaseLostError("lease held by run b7 on host-2"))
    h.coordinator.start_scheduler()
    first = h.trigger()
    second = h.trigger()
    h.ack_all(1)
    assert failure_reason(first) is R.LEASE_LOST
    assert failure_reason(second) is R.LEASE_LOST
    [(reason, error)] = h.failed_jobs
    assert reason is R.LEASE_LOST and reason.fatal
    assert isinstance(error, LeaseLostError)
    assert h.storage.discarded_locations == [] and h.storage.discarded_completed == []
    assert h.coordinator.is_shutdown and not h.coordinator.periodic_scheduling
    assert failure_reason(h.trigger(forced=True)) is R.COORDINATOR_SHUTDOWN
    h.scheduler.advance(10_000)
    assert h.gateway.triggered_ids == [1, 2]


def test_failing_notification_does_not_fail_the_checkpoint(h):
    h.gateway.fail_notify = RuntimeError("kafka coordinator not available")
    data = h.complete(h.trigger())
    assert data.checkpoint_id == 1
    assert h.coordinator.completed_store.latest() == data
    assert h.failures() == {}


def test_stats_record_duration_and_bytes_from_ack_metrics(h):
    h.trigger()
    h.scheduler.advance(250)
    h.ack_all(1, size=1000)
    snapshot = h.coordinator.stats.snapshot()
    assert snapshot["completed"] == 1 and snapshot["triggered"] == 1
    assert snapshot["last_completed_id"] == 1
    assert snapshot["last_duration_ms"] == 250
    assert snapshot["last_size_bytes"] == 3000
    assert snapshot["in_progress"] == 0


def test_aborted_checkpoint_files_are_deleted_only_after_its_writers_stopped():
    """Seed 000 at unit level: the first decline must not pull the directory from under
    a participant whose upload is still running, and that upload's late error must not
    count or fail anything."""
    h = make_harness(tolerable_failed=0)
    h.gateway.complete_aborts = False
    h.trigger()
    h.coordinator.decline(1, "source:numbers", R.TASK_NOT_READY)
    assert h.gateway.aborted_ids == [1]
    assert h.storage.discarded_locations == []  # state:count/0 may still be uploading

    assert h.coordinator.decline(1, "state:count/0", R.TASK_ASYNC_FAILURE, OSError("Path doesn't exist")) is False
    assert h.failed_jobs == []

    h.gateway.abort_futures[1].set_result(None)  # the upload was cancelled and has stopped
    assert h.storage.discarded_locations == [1]


def test_files_stay_when_the_writers_could_not_be_confirmed_stopped():
    h = make_harness()
    h.gateway.complete_aborts = False
    h.trigger()
    h.coordinator.decline(1, "job", R.DECLINED_BY_TASK)
    h.gateway.abort_futures[1].set_exception(TimeoutError("executor lost"))
    assert h.storage.discarded_locations == []


def test_failed_delete_of_an_aborted_checkpoint_is_not_fatal(caplog):
    h = make_harness()
    h.storage.fail("discard_location", StorageError("permission denied"))
    h.trigger()
    h.coordinator.decline(1, "job", R.DECLINED_BY_TASK)
    assert "could not delete the files of aborted checkpoint 1" in caplog.text
    assert h.complete(h.trigger()).checkpoint_id == 2


def test_lease_lost_while_deleting_a_subsumed_checkpoint_stops_the_job():
    h = make_harness(num_retained=1)
    h.complete(h.trigger())
    h.storage.fail("discard_completed", LeaseLostError("fenced by run c3"))
    second = h.complete(h.trigger())
    assert second.checkpoint_id == 2  # it is durable; only the cleanup hit the lost lease
    assert [reason for reason, _ in h.failed_jobs] == [R.LEASE_LOST]
    assert h.coordinator.is_shutdown
    assert failure_reason(h.trigger(forced=True)) is R.COORDINATOR_SHUTDOWN


def test_lease_lost_when_creating_the_directory_stops_the_job_instead_of_counting():
    h = make_harness()
    h.storage.fail("initialize_location", LeaseLostError("fenced"))
    assert failure_reason(h.trigger()) is R.LEASE_LOST
    assert [reason for reason, _ in h.failed_jobs] == [R.LEASE_LOST]
    assert h.coordinator.failure_manager.consecutive_failures == 0
    assert h.coordinator.is_shutdown


def test_handles_already_acked_by_in_flight_checkpoints_are_kept_when_discarding():
    h = make_harness(num_retained=1, max_concurrent=2)
    h.complete(h.trigger())  # 1
    h.trigger()  # 2
    h.trigger()  # 3, in flight while 2 completes and pushes out 1
    h.ack(3, "state:count/0")
    h.ack_all(2)
    [(discarded_id, still_referenced)] = h.storage.discarded_completed
    assert discarded_id == 1
    assert handle_for(3, "state:count/0") in still_referenced
    assert handle_for(2, "job") in still_referenced


# ---------------------------------------------------------------- shared files of aborted checkpoints
def _shared(checkpoint_id: int, participant: str) -> dict:
    return {"participant": participant, "shared": [f"shared/{participant}-{checkpoint_id}.sst"]}


def test_shared_files_of_an_aborted_checkpoint_are_discarded_once_its_writers_stopped():
    """Files an aborted checkpoint uploaded to shared/ used to wait for the
    start-up GC. Once the abort future says its writers stopped, the coordinator hands
    storage the handles it was acked with and everything that must be kept: retained
    checkpoints, other in-flight checkpoints, and the runtime's live references."""
    storage = DiscardingStorage()
    live = [{"participant": "state:count/0", "shared": ["shared/live.sst"]}]
    h = make_harness(storage=storage, max_concurrent=2, live_references=lambda: live)
    h.complete(h.trigger())  # 1: retained
    h.gateway.complete_aborts = False
    h.trigger()  # 2: will be aborted
    h.trigger()  # 3: in flight
    h.coordinator.acknowledge(2, "job", _shared(2, "job"))
    h.coordinator.acknowledge(2, "source:numbers", _shared(2, "source"))
    h.coordinator.acknowledge(3, "job", _shared(3, "job"))
    h.coordinator.decline(2, "state:count/0", R.TASK_ASYNC_FAILURE, OSError("upload failed"))
    assert storage.discarded_aborted == []  # writers may still be uploading

    h.gateway.abort_futures[2].set_result(None)
    [(checkpoint_id, handles, still_referenced)] = storage.discarded_aborted
    assert checkpoint_id == 2
    assert sorted(map(str, handles)) == sorted(map(str, [_shared(2, "job"), _shared(2, "source")]))
    kept = list(map(str, still_referenced))
    assert str(_shared(3, "job")) in kept  # another in-flight checkpoint
    assert str(live[0]) in kept  # the running job's live state
    assert all(str(handle_for(1, p)) in kept for p in h.gateway.participant_ids)  # retained
    assert str(_shared(2, "job")) not in kept
    assert storage.discarded_locations == []  # discard_aborted replaces discard_location
    assert 2 not in storage.directories


def test_a_late_ack_of_an_aborted_checkpoint_has_its_files_discarded_too():
    """The handle of an upload that finished just after the abort is not lost: its files
    are discarded with the others once the writers stopped."""
    storage = DiscardingStorage()
    h = make_harness(storage=storage)
    h.gateway.complete_aborts = False
    h.trigger()
    h.coordinator.decline(1, "job", R.DECLINED_BY_TASK)
    assert h.coordinator.acknowledge(1, "state:count/0", _shared(1, "late")) is AckResult.DISCARDED
    h.gateway.abort_futures[1].set_result(None)
    [(_, handles, _)] = storage.discarded_aborted
    assert handles == [_shared(1, "late")]


def test_aborted_checkpoint_files_stay_when_writers_are_not_confirmed_stopped_with_discard_aborted():
    storage = DiscardingStorage()
    h = make_harness(storage=storage)
    h.gateway.complete_aborts = False
    h.trigger()
    h.coordinator.acknowledge(1, "job", _shared(1, "job"))
    h.coordinator.decline(1, "source:numbers", R.DECLINED_BY_TASK)
    h.gateway.abort_futures[1].set_exception(TimeoutError("executor lost"))
    assert storage.discarded_aborted == [] and storage.discarded_locations == []


def test_failed_discard_of_aborted_shared_files_is_logged_not_fatal(caplog):
    storage = DiscardingStorage()
    storage.raise_on("discard_aborted", RuntimeError("s3 throttled"))
    h = make_harness(storage=storage)
    h.trigger()
    h.coordinator.acknowledge(1, "job", _shared(1, "job"))
    h.coordinator.decline(1, "source:numbers", R.DECLINED_BY_TASK)
    assert "could not delete the files of aborted checkpoint 1" in caplog.text
    assert h.complete(h.trigger()).checkpoint_id == 2


def test_live_references_are_kept_when_discarding_subsumed_checkpoints():
    """The runtime's live handles join `still_referenced` for subsumption too."""
    live = [{"participant": "state:count/0", "shared": ["shared/not-yet-checkpointed.sst"]}]
    h = make_harness(num_retained=1, live_references=lambda: live)
    h.complete(h.trigger())
    h.complete(h.trigger())
    [(discarded_id, still_referenced)] = h.storage.discarded_completed
    assert discarded_id == 1 and live[0] in still_referenced


def test_a_raising_live_references_hook_keeps_every_shared_file(caplog):
    """If the runtime cannot say what it still needs, no shared file is deleted (safe
    side): subsumed checkpoints stay whole, an aborted one loses only its own chk-<id>/."""
    def broken():
        raise RuntimeError("lineage registry closed")

    storage = DiscardingStorage()
    h = make_harness(storage=storage, num_retained=1, live_references=broken)
    h.complete(h.trigger())
    h.complete(h.trigger())
    assert h.storage.discarded_completed == []
    h.trigger()
    h.coordinator.acknowledge(3, "job", _shared(3, "job"))
    h.coordinator.decline(3, "source:numbers", R.DECLINED_BY_TASK)
    assert storage.discarded_aborted == [] and storage.discarded_locations == [3]
    assert h.failures() == {"DECLINED_BY_TASK": 1}
    assert "lineage registry closed" in caplog.text


def test_handles_of_a_checkpoint_waiting_to_finalize_are_kept_when_discarding():
    """A checkpoint whose last ack arrived has left the pending set but is not in the
    completed store yet: its handles must still count as referenced while an earlier
    finalization discards what it subsumed."""
    storage = StallingStorage()
    h = make_harness(storage=storage, num_retained=1, max_concurrent=2)
    h.complete(h.trigger())  # 1
    h.trigger()  # 2
    h.trigger()  # 3
    gate = storage.stall("commit_metadata")
    acker2 = threading.Thread(target=h.ack_all, args=(2,), daemon=True)
    acker2.start()
    assert gate.entered.wait(WAIT_S)
    acker3 = threading.Thread(target=h.ack_all, args=(3,), daemon=True)
    acker3.start()
    wait_until(lambda: h.coordinator.pending_checkpoint_ids() == [], "3 waits for 2's finalization")
    gate.open()
    acker2.join(WAIT_S)
    acker3.join(WAIT_S)
    discarded = dict(storage.discarded_completed)
    assert handle_for(3, "job") in discarded[1]


# ---------------------------------------------------------------- a raising fail-job callback
def test_raising_fail_job_callback_does_not_stop_the_abort_half_way(caplog):
    """The fail-job callback raising used to leave the future open, the abort
    unsent and the files kept. Now the cleanup always runs and the error is logged."""
    def fail_job(reason, error):
        raise RuntimeError("job master is gone")

    h = make_harness(tolerable_failed=0, fail_job=fail_job)
    future = h.trigger()
    assert h.coordinator.decline(1, "job", R.DECLINED_BY_TASK) is True
    assert failure_reason(future) is R.DECLINED_BY_TASK
    assert h.gateway.aborted_ids == [1]
    assert h.storage.discarded_locations == [1]
    assert "job master is gone" in caplog.text
    assert h.complete(h.trigger()).checkpoint_id == 2


def test_abort_cleanup_runs_even_if_reporting_the_failure_raises():
    """Whatever raises while reporting (a broken stats tracker
    here), the future, the abort and the file deletion still happen."""
    h = make_harness()

    def broken(*args, **kwargs):
        raise RuntimeError("stats broken")

    h.coordinator.stats.report_failed = broken
    future = h.trigger()
    with pytest.raises(RuntimeError, match="stats broken"):
        h.coordinator.decline(1, "job", R.DECLINED_BY_TASK)
    assert failure_reason(future) is R.DECLINED_BY_TASK
    assert h.gateway.aborted_ids == [1]
    assert h.storage.discarded_locations == [1]


def test_a_checkpoint_being_finalized_counts_as_in_flight_so_a_failure_of_the_next_cannot_outrun_its_success():
    """max-concurrent 1: while checkpoint 2 writes its `_metadata`, no checkpoint 3 starts.
    Otherwise 3 could fail (storage down for it) and be counted before 2's success
    reset the count: with 2 failures before it and a tolerance of 2, the job failed over
    although a checkpoint had just completed (seen in a CI run)."""
    storage = StallingStorage()
    h = make_harness(storage=storage, max_concurrent=1, tolerable_failed=2)
    h.complete(h.trigger())  # 1
    gate = storage.stall("commit_metadata")
    h.trigger()  # 2
    acker = threading.Thread(target=h.ack_all, args=(2,), daemon=True)
    acker.start()
    assert gate.entered.wait(WAIT_S)
    refused = h.trigger()
    assert failure_reason(refused) is R.TOO_MANY_CONCURRENT
    gate.open()
    acker.join(WAIT_S)
    assert h.coordinator.completed_store.latest().checkpoint_id == 2
    assert h.failed_jobs == []
