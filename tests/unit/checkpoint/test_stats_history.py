from __future__ import annotations

from prometheus_client import CollectorRegistry

from sparkpoint.checkpoint import CheckpointFailureReason as R, CheckpointStatsTracker


def test_history_details_and_summary_follow_each_checkpoint():
    registry = CollectorRegistry()
    stats = CheckpointStatsTracker("orders", registry, history_size=3)
    stats.report_triggered(1, trigger_timestamp_ms=1_000)
    stats.report_acknowledged(1, "job", 1_100)
    stats.report_acknowledged(1, "state:op/0", 1_400, {"bytes": 700, "async_ms": 250})
    stats.report_completed(1, duration_ms=500, size_bytes=700, completed_at_ms=1_500)
    stats.report_triggered(2, trigger_timestamp_ms=2_000)
    stats.report_failed(2, R.EXPIRED, failed_at_ms=9_000)
    stats.report_triggered(3, trigger_timestamp_ms=10_000)
    stats.report_failed(3, R.COORDINATOR_SHUTDOWN, failed_at_ms=10_050)
    stats.report_triggered(4, trigger_timestamp_ms=11_000)

    history = stats.history()
    assert [(h["id"], h["status"]) for h in history] == [(4, "IN_PROGRESS"), (3, "ABORTED"), (2, "FAILED")]
    assert history[2]["failure_reason"] == "EXPIRED" and history[2]["end_to_end_duration"] == 7_000
    assert stats.details(1) is None, "only the newest history_size checkpoints are kept"

    stats2 = CheckpointStatsTracker("orders")
    stats2.report_triggered(1, trigger_timestamp_ms=1_000)
    stats2.report_acknowledged(1, "job", 1_100)
    stats2.report_acknowledged(1, "state:op/0", 1_400, {"bytes": 700, "async_ms": 250})
    stats2.report_completed(1, duration_ms=500, size_bytes=700, completed_at_ms=1_500)
    details = stats2.details(1)
    assert details["status"] == "COMPLETED" and (details["sync_duration"], details["async_duration"]) == (150, 250)
    assert {p["id"]: (p["sync_duration"], p["async_duration"], p["bytes"]) for p in details["participants"]} == {
        "job": (100, 0, 0), "state:op/0": (150, 250, 700)}
    summary = stats2.summary()
    assert summary["end_to_end_duration"]["p99"] == 500 and summary["state_size"]["max"] == 700
    assert summary["async_duration"]["p50"] == 250

    labels = {"job_name": "orders"}
    assert registry.get_sample_value("sparkpoint_checkpoint_size_bytes_count", labels) == 1
    stats.report_restored(1, restore_timestamp_ms=20_000)
    assert stats.snapshot()["restored"] == 1 and stats.snapshot()["last_restored"]["id"] == 1
    assert registry.get_sample_value("sparkpoint_checkpoint_restores_total", labels) == 1
