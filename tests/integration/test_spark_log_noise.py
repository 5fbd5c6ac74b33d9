"""A failed task is reported by the job master in one line (the full trace in a file); Spark's
own copies of it must not reach the user's terminal as Java traces. Besides the executor's and
the task set manager's trace of the failure itself, a Python worker that fails while Spark
streams Arrow batches to it makes Spark log the Arrow allocator's leak check from a task
completion listener, with a Java stack trace (seen in `sparkpoint run` of a processor that
raises)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark

QUIET = ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager",
         "org.apache.spark.TaskContextImpl", "org.apache.arrow.memory.BaseAllocator")


@pytest.mark.parametrize("logger", QUIET)
def test_spark_logs_no_trace_of_a_failed_task_on_a_sparkpoint_session(spark, logger: str) -> None:
    log4j = spark.sparkContext._jvm.org.apache.logging.log4j
    assert not log4j.LogManager.getLogger(logger).isErrorEnabled(), logger
