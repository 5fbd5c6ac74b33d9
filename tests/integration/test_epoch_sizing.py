"""`sparkpoint.epoch.target-duration`: a job whose epochs take longer than the target
gets shorter epochs, and its output is still every record once."""

from __future__ import annotations

import time

import pyarrow.dataset as ds
import pytest
from pyspark.sql import functions as F

from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline, Settings
from sparkpoint.checkpoint.reasons import CheckpointFailureReason
from sparkpoint.connectors.base import SlicePlan, SourceContext
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus

pytestmark = pytest.mark.spark

TOTAL = 22_500
PER_EPOCH = 15_000


def _source() -> GeneratorSource:
    return GeneratorSource("ev", keys=200, total_events=TOTAL, max_records_per_epoch=PER_EPOCH)


def test_epochs_longer_than_the_target_are_cut_and_every_record_counts_once(spark, tmp_path):
    def _slow(batches):  # defined here: pickled by value, the executors cannot import this module
        """200 µs per record in each task: an epoch of 15k records takes 1.5 s or more."""
        for pdf in batches:
            time.sleep(len(pdf) * 200e-6)
            yield pdf

    source = _source()
    pipeline = (Pipeline("sized").source(source)
                .transform(lambda df: df.mapInPandas(_slow, df.schema))
                .stateful(KeyedAggregate("agg", ["key"], "value", aggs=("count", "sum"), value_type="bigint"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    settings = Settings.load(overrides={
        "pipeline.name": "sized", "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "sparkpoint.progress": False, "restart-strategy.type": "none",
        "sparkpoint.epoch.target-duration": "1 s"})
    master = JobMaster(pipeline, settings, spark=spark)
    result = master.run()
    assert result.status is JobStatus.FINISHED
    assert result.records == TOTAL
    assert master.epoch_sizer.budget is not None and master.epoch_sizer.budget < PER_EPOCH

    ref = _source()
    ref.open(SourceContext(spark, "reference"))
    start = ref.initial_positions()
    events = ref.read(SlicePlan(start, {s: start[s] + n for s, n in ref.lag(start).items()}))
    expected = {r["key"]: (r["count"], r["sum"]) for r in
                events.groupBy("key").agg(F.count(F.lit(1)).alias("count"), F.sum("value").alias("sum")).collect()}
    out = ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive").to_table().to_pylist()
    # By the sources' limit alone the input is 2 epochs. Every epoch that reads input
    # updates keys and so writes rows; the empty epochs at the end of input write none
    # (counting all epochs would count those too: `result.epochs` is 4 uncut).
    input_epochs = {r["epoch"] for r in out}
    assert len(input_epochs) >= 3, f"the input was not cut: it was read in epochs {sorted(input_epochs)}"
    final = {r["key"]: (r["count"], r["sum"]) for r in sorted(out, key=lambda r: r["epoch"])}
    assert final == expected


def test_a_slow_step_slows_the_job_without_making_its_checkpoints_expire(spark, tmp_path):
    """No target set: the default ceiling (a quarter of the checkpoint timeout) cuts the
    epochs after the first slow one. Epochs of 30k records take 6 s or more here, as long
    as the timeout a checkpoint has. By the sources' limit alone the job runs two such
    epochs and a final one, and at most 3 checkpoints complete; cut, the short epochs
    each carry one."""
    def _slow(batches):
        for pdf in batches:
            time.sleep(len(pdf) * 400e-6)
            yield pdf

    total, per_epoch = 45_000, 30_000
    source = GeneratorSource("ev", keys=200, total_events=total, max_records_per_epoch=per_epoch)
    pipeline = (Pipeline("ceiling").source(source)
                .transform(lambda df: df.mapInPandas(_slow, df.schema))
                .stateful(KeyedAggregate("agg", ["key"], "value", aggs=("count", "sum"), value_type="bigint"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    settings = Settings.load(overrides={
        "pipeline.name": "ceiling", "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "sparkpoint.progress": False, "restart-strategy.type": "none",
        "execution.checkpointing.interval": "500 ms", "execution.checkpointing.timeout": "6 s"})
    master = JobMaster(pipeline, settings, spark=spark)
    result = master.run()
    assert result.status is JobStatus.FINISHED and result.records == total
    stats = master.coordinator.stats.snapshot()
    history = sorted(master.coordinator.stats.history(), key=lambda c: c["id"])
    expired = [c["id"] for c in history if c["failure_reason"] == "EXPIRED"]
    completed = [c["id"] for c in history if c["status"] == "COMPLETED"]
    # Checkpoints triggered during the first, uncut epoch expire; none after it does.
    assert len(completed) >= 6 and all(i < min(completed) for i in expired), history
    counted = {r for r in stats["failures_by_reason"] if CheckpointFailureReason[r].counted}
    assert counted <= {"EXPIRED"}, stats  # ("not now" answers such as TOO_MANY_CONCURRENT are no failures)
    assert master.epoch_sizer.budget is not None and master.epoch_sizer.budget < per_epoch

    out = ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive").to_table().to_pylist()
    final = {r["key"]: (r["count"], r["sum"]) for r in sorted(out, key=lambda r: r["epoch"])}
    ref = GeneratorSource("ev", keys=200, total_events=total, max_records_per_epoch=per_epoch)
    ref.open(SourceContext(spark, "reference"))
    start = ref.initial_positions()
    events = ref.read(SlicePlan(start, {s: start[s] + n for s, n in ref.lag(start).items()}))
    assert final == {r["key"]: (r["count"], r["sum"]) for r in
                     events.groupBy("key").agg(F.count(F.lit(1)).alias("count"), F.sum("value").alias("sum")).collect()}
