"""`sparkpoint.epoch.target-duration`: a job whose epochs take longer than the target
gets shorter epochs, and its output is still every record once."""

from __future__ import annotations

import time

import pyarrow.dataset as ds
import pytest
from pyspark.sql import functions as F

from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline, Settings
from sparkpoint.connectors.base import SlicePlan, SourceContext
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus

pytestmark = pytest.mark.spark

TOTAL = 45_000
PER_EPOCH = 30_000


def _source() -> GeneratorSource:
    return GeneratorSource("ev", keys=200, total_events=TOTAL, max_records_per_epoch=PER_EPOCH)


def test_epochs_longer_than_the_target_are_cut_and_every_record_counts_once(spark, tmp_path):
    def _slow(batches):  # defined here: pickled by value, the executors cannot import this module
        """200 µs per record in each task: an epoch of 30k records takes 3 s or more."""
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
        "sparkpoint.epoch.target-duration": "2 s"})
    master = JobMaster(pipeline, settings, spark=spark)
    result = master.run()
    assert result.status is JobStatus.FINISHED
    assert result.records == TOTAL
    # By the sources' limit alone this is 2 epochs (+ the final empty one).
    assert result.epochs >= 4
    assert master.epoch_sizer.budget is not None and master.epoch_sizer.budget < PER_EPOCH

    ref = _source()
    ref.open(SourceContext(spark, "reference"))
    start = ref.initial_positions()
    events = ref.read(SlicePlan(start, {s: start[s] + n for s, n in ref.lag(start).items()}))
    expected = {r["key"]: (r["count"], r["sum"]) for r in
                events.groupBy("key").agg(F.count(F.lit(1)).alias("count"), F.sum("value").alias("sum")).collect()}
    out = ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive").to_table().to_pylist()
    final = {r["key"]: (r["count"], r["sum"]) for r in sorted(out, key=lambda r: r["epoch"])}
    assert final == expected
