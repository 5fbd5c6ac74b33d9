"""PySpark's daemon collects garbage in a reused Python worker after every task, walking
every object the worker's collector tracks. Once a worker has run an epoch's tasks, the
modules, classes and functions it imported are frozen out of that walk, so the collection
after each later task looks at the few objects tasks create, not at the whole heap."""

from __future__ import annotations

import gc

import pytest

from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline, Settings
from sparkpoint.runtime.executor.worker_heap import freeze_long_lived_objects
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus

pytestmark = pytest.mark.spark


def test_outside_a_spark_task_the_collector_is_left_alone() -> None:
    frozen = gc.get_freeze_count()
    assert freeze_long_lived_objects() is False
    assert gc.get_freeze_count() == frozen


def test_workers_that_ran_an_epoch_leave_their_imported_heap_out_of_each_collection(spark, tmp_path) -> None:
    pipeline = (Pipeline("heap").source(GeneratorSource("ev", keys=20, total_events=400, max_records_per_epoch=100))
                .stateful(KeyedAggregate("agg", ["key"], "value", aggs=("count",), value_type="bigint"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    settings = Settings.load(overrides={
        "pipeline.name": "heap", "parallelism.default": 2, "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "sparkpoint.progress": False, "rest.enabled": False,
        "restart-strategy.type": "none"})
    assert JobMaster(pipeline, settings, spark=spark).run().status == JobStatus.FINISHED

    def heap_of_this_worker(batches):
        import gc
        import os
        import sys

        import pyarrow as pa

        ran_an_epoch = "sparkpoint.runtime.executor.subtask" in sys.modules
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist([{"pid": os.getpid(), "ran_an_epoch": ran_an_epoch,
                                           "frozen": gc.get_freeze_count(), "walked": len(gc.get_objects())}])

    workers = {r["pid"]: r for r in spark.range(0, 4, 1, 4).mapInArrow(
        heap_of_this_worker, "pid long, ran_an_epoch boolean, frozen long, walked long").collect()}
    ran = [w for w in workers.values() if w["ran_an_epoch"]]
    assert ran, f"no Python worker that ran the job's epochs answered: {workers}"
    for w in ran:
        # pyarrow, pandas and sparkpoint alone are tens of thousands of objects
        assert w["frozen"] > 20_000, w
        assert w["walked"] < w["frozen"] / 4, w
