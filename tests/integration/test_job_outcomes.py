"""How a job ends, and what it reports, when something goes wrong around its epochs: a
savepoint deleted after the job started from it, a final commit that fails, storage
down while restoring, a read error that can never succeed, a failing map_output step,
a cancel during the restart backoff. In process on the shared local SparkSession; the
output is compared with the batch answer of failure_support.expected_windows."""

from __future__ import annotations

import shutil
from typing import Callable

import pandas as pd
import pyarrow.parquet as pq
import pytest
from failure_support import Events, ObservedJob, OnThread, Tripwire, expected_windows, settings, wait_until

from sparkpoint import FileSource, ParquetSink, Pipeline
from sparkpoint.errors import JobFailedError, StorageError
from sparkpoint.ops.cli import exit_code
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus
from tests.e2e.harness import canonical, read_output

pytestmark = pytest.mark.spark

SMALL = Events(keys=50, total=16_000, per_epoch=2_000)
# Paced: a run (3 s at least) spans ten checkpoint intervals of 300 ms however fast
# epochs run; PACED_CHECKPOINTS goes with every run of it.
PACED = Events(keys=50, total=24_000, per_epoch=2_000, rate_per_s=8_000)
PACED_CHECKPOINTS = {"execution.checkpointing.interval": "300 ms"}


@pytest.fixture(scope="module")
def expected(spark) -> dict[Events, list[tuple]]:
    return {events: expected_windows(spark, events) for events in (SMALL, PACED)}


def _output(root) -> list[tuple]:
    return canonical(read_output(root / "out"))


def _completed(job) -> int:
    coordinator = getattr(job, "coordinator", None)
    return int(coordinator.stats.snapshot().get("completed", 0)) if coordinator else 0


def test_a_deleted_savepoint_does_not_make_the_next_failover_fatal(spark, tmp_path, expected):
    """NO_CLAIM: once the job has checkpoints of its own, the savepoint it started from is
    the user's to delete. A failover after that, and a rerun with the same command line,
    resume from the job's own checkpoints without reading the savepoint."""
    first = OnThread(JobMaster(PACED.pipeline("sp", tmp_path / "out"),
                               settings(tmp_path, "sp", [], **PACED_CHECKPOINTS), spark=spark))
    wait_until(lambda: first.job.epoch >= 2 and _completed(first.job) >= 1)
    savepoint = first.job.stop(savepoint=True, target=str(tmp_path / "savepoint")).result(120)
    assert first.join().status is JobStatus.FINISHED

    trip = Tripwire()
    from_savepoint = {"execution.state-recovery.path": savepoint}
    second = ObservedJob(PACED.pipeline("sp", tmp_path / "out", transform=trip),
                         settings(tmp_path, "sp", [], **from_savepoint, **PACED_CHECKPOINTS), spark=spark)
    running = OnThread(second)
    wait_until(lambda: second.restored_from is not None and getattr(second, "completed_ids", None))
    shutil.rmtree(savepoint)  # "yours to delete"
    trip.arm()  # the next epoch fails once: a failover
    result = running.join()
    assert running.error is None, running.error
    assert result.status is JobStatus.FINISHED and result.restarts == 1
    assert _output(tmp_path) == expected[PACED]

    rerun = JobMaster(PACED.pipeline("sp", tmp_path / "out"),
                      settings(tmp_path, "sp", [], **from_savepoint, **PACED_CHECKPOINTS), spark=spark).run()
    assert rerun.status is JobStatus.FINISHED
    assert _output(tmp_path) == expected[PACED]


class FinalCheckpointJob(ObservedJob):
    """Knows when the final checkpoint (end of the bounded input) has been triggered: the
    faults below hit only its completion, not the periodic checkpoints before it."""

    def _setup(self) -> None:
        super()._setup()
        self.final_triggered = False
        trigger = self.coordinator.trigger_checkpoint

        def triggering(*args, **kwargs):
            if self.finishing and kwargs.get("forced"):
                self.final_triggered = True
            return trigger(*args, **kwargs)

        self.finishing = False
        self.coordinator.trigger_checkpoint = triggering

    def _finish(self) -> None:
        self.finishing = True
        super()._finish()


def _fail_sink_commits(job, armed: Callable[[], bool], budget: str) -> None:
    """Once `armed()`, the job's sink commits raise an injected fault while the job's
    counter `budget` is above 0, each failure taking one from it."""
    commit = job.sink.commit

    def failing_commit(handle):
        if armed() and getattr(job, budget) > 0:
            setattr(job, budget, getattr(job, budget) - 1)
            raise StorageError("injected fault: publishing the sink's staged files")
        return commit(handle)

    job.sink.commit = failing_commit


class CommitFailingJob(FinalCheckpointJob):
    """The sink's commit of the final checkpoint fails `fail_final_commits` times."""

    fail_final_commits = 0

    def _setup(self) -> None:
        super()._setup()
        _fail_sink_commits(self, lambda: self.final_triggered, "fail_final_commits")


def test_a_failed_commit_of_the_final_checkpoint_is_retried_before_the_job_reports_finished(
        spark, tmp_path, expected, monkeypatch):
    monkeypatch.setattr(CommitFailingJob, "FINAL_COMMIT_BACKOFF_S", (0.05, 0.05, 0.05), raising=False)
    job = CommitFailingJob(SMALL.pipeline("final", tmp_path / "out"), settings(tmp_path, "final", []), spark=spark)
    job.fail_final_commits = 2
    result = job.run()
    assert result.status is JobStatus.FINISHED and result.restarts == 0
    assert job.fail_final_commits == 0, "the commit was retried"
    assert _output(tmp_path) == expected[SMALL], "FINISHED means the output is committed"


def test_a_final_commit_that_keeps_failing_never_reports_finished(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(CommitFailingJob, "FINAL_COMMIT_BACKOFF_S", (0.05, 0.05), raising=False)
    job = CommitFailingJob(SMALL.pipeline("final", tmp_path / "out"),
                           settings(tmp_path, "final", [], **{"restart-strategy.type": "none"}), spark=spark)
    job.fail_final_commits = 10**6
    with pytest.raises(JobFailedError, match=r"the commit of the final checkpoint \d+ failed 3 times "
                                             r"\(injected fault: publishing"):
        job.run()
    assert job.status.status is JobStatus.FAILED


class CommitsFailingJob(ObservedJob):
    """After the first completed checkpoint, the sink's next `fail_commits` commits fail
    (a sink that cannot publish any more: a producer stuck in its client, revoked write
    access); the ones after succeed, the recovery's included."""

    fail_commits = 0

    def _setup(self) -> None:
        super()._setup()
        _fail_sink_commits(self, lambda: bool(self.completed_ids), "fail_commits")


def test_commits_failing_more_times_in_a_row_than_tolerated_fail_over_and_recovery_publishes_once(
        spark, tmp_path, expected, caplog):
    """Without the bound, each failed commit waits for the next checkpoint's, for ever: the
    job says RUNNING and its output has stopped."""
    job = CommitsFailingJob(PACED.pipeline("stuck", tmp_path / "out"),
                            settings(tmp_path, "stuck", [], **PACED_CHECKPOINTS,
                                     **{"sparkpoint.sink.tolerable-failed-commits": 2}), spark=spark)
    job.fail_commits = 3
    result = job.run()
    assert result.status is JobStatus.FINISHED and result.restarts == 1
    assert job.fail_commits == 0
    stats = job.coordinator.stats.snapshot()
    assert (stats["commit_failures"], stats["consecutive_commit_failures"]) == (3, 0)
    assert "fails over: the commits of 3 completed checkpoints in a row failed, more than " \
           "sparkpoint.sink.tolerable-failed-commits=2" in caplog.text
    assert _output(tmp_path) == expected[PACED]


def test_commits_failing_within_the_tolerance_are_made_up_for_without_a_failover(spark, tmp_path, expected):
    job = CommitsFailingJob(PACED.pipeline("hiccup", tmp_path / "out"),
                            settings(tmp_path, "hiccup", [], **PACED_CHECKPOINTS,
                                     **{"sparkpoint.sink.tolerable-failed-commits": 2}), spark=spark)
    job.fail_commits = 2
    result = job.run()
    assert result.status is JobStatus.FINISHED and result.restarts == 0
    assert job.coordinator.stats.snapshot()["commit_failures"] == 2
    assert _output(tmp_path) == expected[PACED]


def test_a_storage_outage_during_restore_is_not_a_permanent_failure(spark, tmp_path, expected):
    """The epoch fails once; then checkpoint storage refuses the reads of the restore for a
    while (each restore attempt fails with the same StorageError). The job keeps restarting
    until storage is back, and ends with the exact output."""
    trip = Tripwire()
    job = ObservedJob(PACED.pipeline("outage", tmp_path / "out", transform=trip),
                      settings(tmp_path, "outage", [{"op": "read", "path": "*/_metadata", "action": "fail",
                                                     "times": 4}], **PACED_CHECKPOINTS), spark=spark)
    running = OnThread(job)
    wait_until(lambda: getattr(job, "completed_ids", None))
    trip.arm()
    result = running.join()
    assert running.error is None, running.error
    assert result.status is JobStatus.FINISHED
    assert result.restarts >= 4, "the restore failed while storage was down, and was retried"
    assert _output(tmp_path) == expected[PACED]


def test_a_parquet_type_mismatch_stops_after_three_attempts_and_names_the_java_cause(spark, tmp_path):
    """Parquet written by pandas stores timestamps as INT64 nanoseconds; a TIMESTAMP schema
    cannot read them. The same failure every epoch: three attempts, then one line with
    Spark's error condition (not "Py4JJavaError: An error occurred while calling o153...")."""
    (tmp_path / "in").mkdir()
    pd.DataFrame({"id": [1, 2], "ts": pd.to_datetime(["2024-01-01", "2024-01-02"])}).to_parquet(
        tmp_path / "in" / "a.parquet")
    pipeline = (Pipeline("nanos")
                .source(FileSource(str(tmp_path / "in"), format="parquet", schema="id BIGINT, ts TIMESTAMP",
                                   bounded=True))
                .sink(ParquetSink(str(tmp_path / "out"))))
    job = JobMaster(pipeline, settings(tmp_path, "nanos", [], **{"restart-strategy.fixed-delay.delay": "10 ms",
                                                                 "restart-strategy.fixed-delay.attempts": 6}),
                    spark=spark)
    with pytest.raises(JobFailedError) as failed:
        job.run()
    line = str(failed.value)
    assert "[FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH]" in line, line
    assert "Expected Spark type timestamp, actual Parquet type INT64" in line, line
    assert "restart-strategy.same-failure.max-attempts=3" in line and "Py4J" not in line, line
    assert job.restarts == 2


def test_a_map_output_failure_names_the_map_output_step(spark, tmp_path):
    def add_label(table):
        raise KeyError("label")

    pipeline = SMALL.pipeline("mapout", tmp_path / "out").map_output(add_label)
    job = JobMaster(pipeline, settings(tmp_path, "mapout", [], **{"restart-strategy.fixed-delay.delay": "10 ms"}),
                    spark=spark)
    with pytest.raises(JobFailedError) as failed:
        job.run()
    line = str(failed.value)
    assert "KeyError: 'label'; in map_output step 'add_label'" in line, line
    assert "in operator" not in line, line


def test_the_records_counter_counts_source_records_not_rows_after_transform(spark, tmp_path):
    from pyspark.sql import functions as F

    def tripled(df):  # an explode: three rows for every record read
        return df.withColumn("copy", F.explode(F.array(F.lit(1), F.lit(2), F.lit(3)))).drop("copy")

    pipeline = SMALL.pipeline("counted", tmp_path / "out", transform=tripled)
    result = JobMaster(pipeline, settings(tmp_path, "counted", []), spark=spark).run()
    assert result.status is JobStatus.FINISHED
    assert result.records == SMALL.total


def test_a_restore_is_recorded_without_the_rest_api(spark, tmp_path):
    trip = Tripwire()
    job = ObservedJob(PACED.pipeline("restores", tmp_path / "out", transform=trip),
                      settings(tmp_path, "restores", [], **{"rest.enabled": False}, **PACED_CHECKPOINTS), spark=spark)
    running = OnThread(job)
    wait_until(lambda: getattr(job, "completed_ids", None))
    trip.arm()
    result = running.join()
    assert result.status is JobStatus.FINISHED and result.restarts == 1
    assert job.restored_from is not None
    assert job.coordinator.stats.snapshot()["restored"] == 1
    assert job.coordinator.stats.registry.get_sample_value(
        "sparkpoint_checkpoint_restores_total", {"job_name": "restores"}) == 1


def test_a_job_cancelled_during_the_restart_backoff_does_not_exit_zero(spark, tmp_path):
    trip = Tripwire()
    trip.arm()
    job = JobMaster(SMALL.pipeline("backoff", tmp_path / "out", transform=trip),
                    settings(tmp_path, "backoff", [], **{"restart-strategy.fixed-delay.delay": "10 min"}),
                    spark=spark)
    running = OnThread(job)
    wait_until(lambda: job.status.status is JobStatus.RESTARTING)
    job.cancel()  # what a Ctrl-C does while the job waits to restart
    result = running.join()
    assert result.status is JobStatus.CANCELED
    assert "Tripped" in result.extra["cancelled_after"]
    assert exit_code(result) != 0


class DeadLetterPublishFails(FinalCheckpointJob):
    """The source's completion hook (which publishes FileSource dead letters) fails for every
    checkpoint before the final one, and twice for the final one."""

    def _setup(self) -> None:
        super()._setup()
        publish = self.source.notify_checkpoint_complete
        self.publish_failures = 2

        def failing_publish(checkpoint_id, positions):
            if not self.final_triggered or self.publish_failures > 0:
                self.publish_failures -= self.final_triggered
                raise OSError("injected fault: moving dead letters out of _staging")
            return publish(checkpoint_id, positions)

        self.source.notify_checkpoint_complete = failing_publish


def test_dead_letters_of_the_final_checkpoint_are_published_before_the_job_reports_finished(
        spark, tmp_path, monkeypatch):
    monkeypatch.setattr(DeadLetterPublishFails, "FINAL_COMMIT_BACKOFF_S", (0.05, 0.05, 0.05), raising=False)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"id": 1}\nnot json\n{"id": 2}\n')
    pipeline = (Pipeline("letters")
                .source(FileSource(str(tmp_path / "in"), schema="id BIGINT", bounded=True,
                                   dead_letter=str(tmp_path / "dead")))
                .sink(ParquetSink(str(tmp_path / "out"))))
    job = DeadLetterPublishFails(pipeline, settings(tmp_path, "letters", []), spark=spark)
    result = job.run()
    assert result.status is JobStatus.FINISHED
    assert job.publish_failures == 0
    files = [str(p) for p in (tmp_path / "dead").glob("*.parquet")]
    assert len(files) == 1, "FINISHED, but the dead letters were never published"
    published = pq.read_table(files[0])
    assert published.column("line").to_pylist() == ["not json"], "the bad record is published once"
    assert not list((tmp_path / "dead" / "_staging").glob("*.parquet")), "FINISHED with dead letters still staged"
    assert sorted(r[0] for r in canonical(read_output(tmp_path / "out"))) == [1, 2]


def test_a_stop_by_signal_that_an_epoch_failure_interrupts_still_stops_with_a_last_checkpoint(
        spark, tmp_path, expected):
    """What a SIGTERM to the whole process group does to Spark's Python workers: the epoch
    that carries the stop's barrier fails. The stop stays a stop (restore once, take the
    last checkpoint there, FINISHED), not a failover that forgets it; a rerun finishes the
    input with nothing lost or twice."""
    import signal

    trip = Tripwire()
    job = ObservedJob(PACED.pipeline("interrupted", tmp_path / "out", transform=trip),
                      settings(tmp_path, "interrupted", [], **PACED_CHECKPOINTS), spark=spark)
    running = OnThread(job)
    wait_until(lambda: getattr(job, "completed_ids", None))
    trip.arm()
    job._on_stop_signal(signal.SIGTERM, None)  # the handler only queues the stop
    result = running.join()
    assert running.error is None, running.error
    assert result.status is JobStatus.FINISHED and result.restarts == 0
    assert job.status.history.count(JobStatus.FAILING) == 1
    assert job.epoch + 1 < PACED.total // PACED.per_epoch, "it stopped before the input ended"

    rerun = JobMaster(PACED.pipeline("interrupted", tmp_path / "out"),
                      settings(tmp_path, "interrupted", [], **PACED_CHECKPOINTS), spark=spark).run()
    assert rerun.status is JobStatus.FINISHED
    assert _output(tmp_path) == expected[PACED]
