"""What the statistics say about checkpoints that did not complete (Flink's
FailedCheckpointStats keeps the subtask stats it had, and the coordinator reports the
stats of acks that arrive after the checkpoint was aborted)."""

from __future__ import annotations

from checkpoint_support import make_harness

from sparkpoint.checkpoint import AckResult, CheckpointFailureReason as R, CheckpointStatsTracker


def _participants(details) -> dict[str, int]:
    return {p["id"]: p["bytes"] for p in details["participants"]}


def test_a_failed_entry_has_the_state_size_its_acks_wrote():
    h = make_harness()
    h.trigger()
    h.ack(1, "job", size=100)
    h.ack(1, "source:numbers", size=200)
    h.coordinator.decline(1, "state:count/0", R.TASK_ASYNC_FAILURE)
    [entry] = h.coordinator.stats.history()
    assert (entry["status"], entry["state_size"], entry["num_acknowledged"]) == ("FAILED", 300, 2)
    assert h.coordinator.stats.details(1)["state_size"] == 300


def test_an_aborted_entry_without_acks_has_state_size_zero():
    stats = CheckpointStatsTracker("orders")
    stats.report_triggered(1, trigger_timestamp_ms=1_000)
    stats.report_failed(1, R.COORDINATOR_SHUTDOWN, failed_at_ms=1_500)
    assert stats.details(1)["state_size"] == 0


def test_a_late_ack_s_metrics_are_recorded_with_the_expired_checkpoint():
    """An upload that finished after the timeout still wrote its bytes: the expired
    checkpoint's details show it (late, with its ack time), and its state size counts
    them (Flink's testCheckpointStatsUpdatedAfterFailure)."""
    h = make_harness(timeout_ms=1_000)
    h.trigger()
    h.ack(1, "job", size=100)
    h.scheduler.advance(1_000)
    assert h.coordinator.stats.details(1)["status"] == "FAILED"
    h.scheduler.advance(300)
    assert h.ack(1, "state:count/0", size=5_000) is AckResult.DISCARDED
    details = h.coordinator.stats.details(1)
    assert details["status"] == "FAILED" and details["failure_reason"] == "EXPIRED"
    assert _participants(details) == {"job": 100, "state:count/0": 5_000}
    assert details["state_size"] == 5_100
    assert details["num_acknowledged"] == 1, "acknowledged before it expired: only job"
    assert {p["id"]: p["late"] for p in details["participants"]} == {"job": False, "state:count/0": True}
    assert details["latest_ack_timestamp"] == 1_300
    assert h.ack(1, "state:count/0", size=1) is AckResult.DISCARDED  # a repeat changes nothing
    assert h.coordinator.stats.details(1)["state_size"] == 5_100
    snapshot = h.coordinator.stats.snapshot()
    assert (snapshot["completed"], snapshot["failed"], snapshot["in_progress"]) == (0, 1, 0)


def test_a_late_ack_never_creates_or_changes_other_entries():
    h = make_harness()
    h.complete(h.trigger())
    assert h.ack(1, "job", size=7) is AckResult.DISCARDED
    assert h.ack(99, "job", size=7) is AckResult.UNKNOWN
    history = h.coordinator.stats.history()
    assert [(e["id"], e["status"], e["state_size"]) for e in history] == [(1, "COMPLETED", 0)]
