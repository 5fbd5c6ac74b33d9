"""An epoch whose input Spark can tell is empty still runs every subtask. Spark runs no
task over such an input: with adaptive execution on (the default in a session the user
built) the stages after a shuffle that produced nothing are dropped, and the optimizer
folds an empty local relation (`limit(0)`, or `createDataFrame([])` over Spark Connect)
through the epoch's repartition. The last epoch of a bounded input is empty, so before,
such a job failed over three times on "subtasks [0, 1] did not report" and stopped."""

from __future__ import annotations

import contextlib

import pytest
from failure_support import Events, expected_windows, settings

from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus
from tests.e2e.harness import canonical, read_output

pytestmark = pytest.mark.spark

EVENTS = Events(keys=20, total=3_000, per_epoch=1_000)


@contextlib.contextmanager
def _adaptive_execution(spark):
    before = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", "true")
    try:
        yield
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", before)


def test_a_job_on_a_session_with_adaptive_execution_finishes_exactly_once(spark, tmp_path):
    expected = expected_windows(spark, EVENTS)
    with _adaptive_execution(spark):
        result = JobMaster(EVENTS.pipeline("adaptive", tmp_path / "out"), settings(tmp_path, "adaptive", []),
                           spark=spark).run()
    assert result.status is JobStatus.FINISHED and result.restarts == 0
    assert canonical(read_output(tmp_path / "out")) == expected


def test_a_step_that_empties_every_epoch_leaves_a_finished_job_with_no_output(spark, tmp_path):
    result = JobMaster(EVENTS.pipeline("nothing", tmp_path / "out", transform=lambda df: df.limit(0)),
                       settings(tmp_path, "nothing", []), spark=spark).run()
    assert result.status is JobStatus.FINISHED and result.restarts == 0
    assert canonical(read_output(tmp_path / "out")) == []
