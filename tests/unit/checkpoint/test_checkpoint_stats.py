from __future__ import annotations

from prometheus_client import CollectorRegistry

from sparkpoint.checkpoint import CheckpointFailureReason as R, CheckpointStatsTracker


def test_snapshot_and_metrics_follow_the_checkpoints():
    registry = CollectorRegistry()
    stats = CheckpointStatsTracker("orders", registry)
    for cid, duration in zip(range(1, 101), range(10, 1010, 10)):
        stats.report_triggered(cid)
        stats.report_completed(cid, duration, size_bytes=cid * 100, completed_at_ms=cid)
    stats.report_triggered(101)
    stats.report_failed(101, R.EXPIRED, failed_at_ms=5)
    stats.report_failed(None, R.TOO_MANY_CONCURRENT, failed_at_ms=6)

    snap = stats.snapshot()
    assert (snap["triggered"], snap["completed"], snap["failed"], snap["declined"]) == (101, 100, 1, 1)
    assert snap["failures_by_reason"] == {"EXPIRED": 1, "TOO_MANY_CONCURRENT": 1}
    assert (snap["last_completed_id"], snap["last_duration_ms"], snap["last_size_bytes"]) == (100, 1000, 10_000)
    assert (snap["duration_p50_ms"], snap["duration_p99_ms"]) == (500, 990)
    assert snap["in_progress"] == 0
    assert snap["last_failed"] == {"id": 101, "reason": "EXPIRED", "failed_at_ms": 5}

    labels = {"job_name": "orders"}
    assert registry.get_sample_value("sparkpoint_checkpoints_completed_total", labels) == 100
    assert registry.get_sample_value("sparkpoint_checkpoint_failures_total",
                                     {"job_name": "orders", "reason": "EXPIRED"}) == 1
    assert registry.get_sample_value("sparkpoint_checkpoint_last_size_bytes", labels) == 10_000
    assert registry.get_sample_value("sparkpoint_checkpoint_duration_seconds_count", labels) == 100


def test_trackers_with_default_registries_do_not_collide():
    first, second = CheckpointStatsTracker("a"), CheckpointStatsTracker("a")
    first.report_triggered(1)
    assert second.snapshot()["triggered"] == 0


def test_empty_snapshot():
    snap = CheckpointStatsTracker("orders").snapshot()
    assert snap["completed"] == 0 and snap["duration_p50_ms"] is None and snap["last_completed_id"] is None


def test_failed_commits_are_counted_and_a_success_ends_the_streak():
    registry = CollectorRegistry()
    stats = CheckpointStatsTracker("orders", registry)
    labels = {"job_name": "orders"}
    assert registry.get_sample_value("sparkpoint_checkpoint_commit_failures_total", labels) == 0
    assert [stats.report_commit(failed=True) for _ in range(3)] == [1, 2, 3]
    assert registry.get_sample_value("sparkpoint_checkpoint_commit_consecutive_failures", labels) == 3
    assert stats.report_commit(failed=False) == 0
    assert stats.report_commit(failed=True) == 1
    snap = stats.snapshot()
    assert (snap["commit_failures"], snap["consecutive_commit_failures"]) == (4, 1)
    assert registry.get_sample_value("sparkpoint_checkpoint_commit_failures_total", labels) == 4
    assert registry.get_sample_value("sparkpoint_checkpoint_commit_consecutive_failures", labels) == 1
