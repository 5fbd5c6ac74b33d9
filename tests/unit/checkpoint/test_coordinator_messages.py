"""Acks and declines, including the races: late, duplicate, unknown and stale messages
change nothing and fail nothing (seed 000)."""

from __future__ import annotations

from checkpoint_support import failure_reason, handle_for, make_harness

from sparkpoint.checkpoint import AckResult, CheckpointFailureReason as R


def test_duplicate_ack_is_reported_and_the_checkpoint_still_waits_for_the_others(h):
    h.trigger()
    assert h.ack(1, "job") is AckResult.SUCCESS
    assert h.ack(1, "job") is AckResult.DUPLICATE
    assert h.coordinator.pending_checkpoint_ids() == [1]
    assert h.storage.metadata == {}


def test_ack_for_an_unknown_checkpoint_changes_nothing(h):
    h.trigger()
    assert h.ack(99, "job") is AckResult.UNKNOWN
    assert h.coordinator.decline(99, "job", R.TASK_ASYNC_FAILURE) is False
    assert h.coordinator.pending_checkpoint_ids() == [1]
    assert h.events == [] and h.failures() == {}


def test_ack_from_a_participant_that_is_not_part_of_the_checkpoint_is_unknown(h):
    h.trigger()
    assert h.ack(1, "sink:somebody-else") is AckResult.UNKNOWN
    assert h.coordinator.pending_checkpoint_ids() == [1]


def test_expiry_fails_the_checkpoint_naming_who_did_not_ack():
    h = make_harness(timeout_ms=5000)
    future = h.trigger()
    h.ack(1, "job")
    h.scheduler.advance(4999)
    assert h.coordinator.pending_checkpoint_ids() == [1]
    h.scheduler.advance(1)
    assert failure_reason(future) is R.EXPIRED
    assert h.coordinator.pending_checkpoint_ids() == []
    [event] = h.events
    assert event.reason is R.EXPIRED and event.counted
    assert "source:numbers" in event.error_summary and "state:count/0" in event.error_summary
    assert "job," not in event.error_summary


def test_ack_after_expiry_is_discarded_and_counts_nothing_more():
    h = make_harness(timeout_ms=5000)
    h.trigger()
    h.scheduler.advance(5000)
    assert [h.ack(1, p) for p in h.gateway.participant_ids] == [AckResult.DISCARDED] * 3
    assert h.storage.metadata == {}
    assert h.coordinator.failure_manager.consecutive_failures == 1
    assert len(h.events) == 1


def test_decline_after_completion_is_ignored(h):
    future = h.trigger()
    data = h.complete(future)
    assert h.coordinator.decline(1, "state:count/0", R.TASK_ASYNC_FAILURE, OSError("late")) is False
    assert future.result(timeout=0) == data
    assert h.coordinator.completed_store.latest() == data
    assert h.events == [] and h.failures() == {}
    assert h.gateway.aborted_ids == []


def test_second_decline_of_the_same_checkpoint_is_stale_and_counted_once(h):
    h.trigger()
    assert h.coordinator.decline(1, "source:numbers", R.TASK_ASYNC_FAILURE) is True
    assert h.coordinator.decline(1, "state:count/0", R.TASK_ASYNC_FAILURE) is False
    assert h.coordinator.failure_manager.consecutive_failures == 1
    assert len(h.events) == 1
    assert h.gateway.aborted_ids == [1]


def test_a_completed_checkpoint_subsumes_an_older_pending_one_whose_late_acks_are_ignored():
    h = make_harness(max_concurrent=2)
    older = h.trigger()
    newer = h.trigger()
    h.ack(1, "job")
    h.ack_all(2)
    assert newer.result(timeout=0).checkpoint_id == 2
    assert failure_reason(older) is R.SUBSUMED
    assert h.coordinator.failure_manager.consecutive_failures == 0
    assert [h.ack(1, p) for p in ("source:numbers", "state:count/0")] == [AckResult.DISCARDED] * 2
    assert h.gateway.notified == [2]  # never for the subsumed one
    assert 1 not in h.storage.metadata
    assert h.storage.discarded_locations == [1]


def test_message_for_a_checkpoint_older_than_the_latest_completed_is_stale():
    h = make_harness(max_concurrent=2)
    h.complete(h.trigger())  # 1
    h.scheduler.advance(1)
    h.coordinator._recent.clear()  # the coordinator forgot the outcome; the id order still tells
    assert h.coordinator.acknowledge(1, "job", handle_for(1, "job")) is AckResult.DISCARDED
    assert h.coordinator.decline(1, "job", R.DECLINED_BY_TASK) is False
    assert h.failures() == {}


def test_counted_and_uncounted_declines():
    h = make_harness()
    h.trigger()
    h.coordinator.decline(1, "state:count/0", R.TASK_NOT_READY)
    h.trigger()
    h.coordinator.decline(2, "state:count/0", R.TASK_SYNC_FAILURE, OSError("disk full"))
    h.trigger()
    h.coordinator.decline(3, "sink:files", R.TASK_CLOSING)
    assert [(e.checkpoint_id, e.reason, e.counted) for e in h.events] == [
        (1, R.TASK_NOT_READY, False), (2, R.TASK_SYNC_FAILURE, True), (3, R.TASK_CLOSING, False)]
    assert h.coordinator.failure_manager.consecutive_failures == 1


def test_a_snapshot_failure_fails_only_that_checkpoint_and_raises_an_alarm(h):
    """Seed 001: an HDFS write failure must not restart the job."""
    h.trigger()
    h.coordinator.decline(1, "state:count/0", R.TASK_ASYNC_FAILURE,
                          OSError("All datanodes DatanodeInfoWithStorage are bad. Aborting..."))
    assert h.failed_jobs == []
    [event] = h.events
    assert (event.checkpoint_id, event.reason, event.participant) == (1, R.TASK_ASYNC_FAILURE, "state:count/0")
    assert "All datanodes" in event.error_summary
    assert (event.consecutive_failures, event.threshold, event.counted) == (1, 3, True)
    assert event.timestamp_ms == h.scheduler.now_ms()
    assert h.complete(h.trigger()).checkpoint_id == 2


def test_tolerance_three_fails_the_job_on_the_fourth_consecutive_counted_failure():
    h = make_harness(tolerable_failed=3)
    for checkpoint_id in (1, 2, 3):
        h.trigger()
        h.coordinator.decline(checkpoint_id, "job", R.DECLINED_BY_TASK)
    assert h.failed_jobs == []
    h.trigger()
    h.coordinator.decline(4, "job", R.DECLINED_BY_TASK)
    [(reason, error)] = h.failed_jobs
    assert reason is R.DECLINED_BY_TASK
    assert "tolerable-failed-checkpoints=3" in str(error)
    assert h.events[-1].consecutive_failures == 4


def test_a_success_between_failures_resets_the_count():
    h = make_harness(tolerable_failed=3)
    for checkpoint_id in (1, 2, 3):
        h.trigger()
        h.coordinator.decline(checkpoint_id, "job", R.TASK_ASYNC_FAILURE)
    h.complete(h.trigger())  # 4
    for checkpoint_id in (5, 6, 7):
        h.trigger()
        h.coordinator.decline(checkpoint_id, "job", R.TASK_ASYNC_FAILURE)
    assert h.failed_jobs == []
    assert h.coordinator.failure_manager.consecutive_failures == 3


def test_uncounted_declines_never_fail_the_job():
    """Seed 002: a job whose participants are still restoring must not crash-loop."""
    h = make_harness(tolerable_failed=0)
    for checkpoint_id in range(1, 21):
        h.trigger()
        h.coordinator.decline(checkpoint_id, "state:count/0", R.TASK_NOT_READY)
    assert h.failed_jobs == []
