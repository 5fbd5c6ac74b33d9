"""The records a job reports are the records its sources read (a transform that filters
or explodes rows does not change the count), and the event time its watermark follows
comes from the subtasks (carried through the pre-aggregation): the max event time of the
rows after the transforms, whatever the operator and whether or not it pre-aggregates."""

from __future__ import annotations

import pandas as pd
import pytest
from pyspark.sql import functions as F

from sparkpoint import (GeneratorSource, KeyedAggregate, ParquetSink, Pipeline, ProcessorOperator, Settings,
                        StatefulProcessor, TumblingWindow)
from sparkpoint.connectors.base import SlicePlan, SourceContext
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus

pytestmark = pytest.mark.spark

TOTAL = 12_000


class Counting(StatefulProcessor):
    def init(self, handle):
        self.n = handle.getValueState("n", "n BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        n = (self.n.get()[0] if self.n.exists() else 0) + sum(len(pdf) for pdf in rows)
        self.n.update((n,))
        yield pd.DataFrame({"key": [key[0]], "n": [n]})


class OwnPreAggregation(KeyedAggregate):
    """A user's operator written before pre_aggregate took the carried columns."""

    def pre_aggregate(self, df):
        return super().pre_aggregate(df)


def _source() -> GeneratorSource:
    return GeneratorSource("ev", keys=300, total_events=TOTAL, max_records_per_epoch=5_000)


def _expected(spark) -> tuple[int, int]:
    src = _source()
    src.open(SourceContext(spark, "expected"))
    start = src.initial_positions()
    rows = src.read(SlicePlan(start, {s: start[s] + n for s, n in src.lag(start).items()})).where("value < 600")
    got = rows.agg(F.count(F.lit(1)).alias("n"), F.max("ts").alias("ts")).first()
    return int(got["n"]), int(got["ts"])


OPERATORS = {
    "keyed-aggregate": lambda: KeyedAggregate("agg", ["key"], "value", aggs=("count", "sum"), value_type="bigint"),
    "window": lambda: TumblingWindow("win", ["key"], "ts", size="10 s"),
    "processor": lambda: ProcessorOperator("proc", Counting, ["key"], "key BIGINT, n BIGINT"),
    "own-pre-aggregation": lambda: OwnPreAggregation("own", ["key"], "value", aggs=("count",), value_type="bigint"),
}


@pytest.mark.parametrize("operator", sorted(OPERATORS))
def test_records_and_max_event_time_are_the_inputs(spark, tmp_path, operator):
    pipeline = (Pipeline("counts").source(_source()).transform(lambda df: df.where("value < 600"))
                .watermark("ts", "2 s").stateful(OPERATORS[operator]()).sink(ParquetSink(str(tmp_path / "out"))))
    settings = Settings.load(overrides={
        "pipeline.name": "counts", "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "sparkpoint.progress": False, "restart-strategy.type": "none"})
    master = JobMaster(pipeline, settings, spark=spark)
    result = master.run()

    after_transform, max_ts = _expected(spark)
    assert result.status == JobStatus.FINISHED
    assert 0 < after_transform < TOTAL, "the transform filtered some rows"
    assert result.records == TOTAL, "every record the source read, counted once, before the transform"
    assert master.max_event_time == max_ts


def test_a_bounded_job_ends_with_one_epoch_that_fires_everything_and_carries_the_final_checkpoint(spark, tmp_path):
    """After the input's last epoch, one empty epoch fires what the final watermark
    releases and carries the forced final checkpoint's barrier: its output is committed
    by that checkpoint, and no further epoch runs just to carry the barrier."""
    source = _source()  # 12,000 events in epochs of 5,000: three epochs of input
    pipeline = (Pipeline("final").source(source).watermark("ts", "2 s")
                .stateful(TumblingWindow("win", ["key"], "ts", size="10 s")).sink(ParquetSink(str(tmp_path / "out"))))
    settings = Settings.load(overrides={
        "pipeline.name": "final", "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "sparkpoint.progress": False, "restart-strategy.type": "none",
        # No periodic checkpoint: the final one is the job's only one.
        "execution.checkpointing.interval": "1 h", "sparkpoint.epoch.max-duration": 0})
    result = JobMaster(pipeline, settings, spark=spark).run()

    assert result.status == JobStatus.FINISHED
    assert result.epochs == 3 + 1, f"{result.epochs} epochs for three epochs of input"
    assert result.completed_checkpoints == 1 and result.last_checkpoint_id == 1

    src = _source()
    src.open(SourceContext(spark, "expected"))
    start = src.initial_positions()
    expected = sorted(
        tuple(r) for r in src.read(SlicePlan(start, {s: start[s] + n for s, n in src.lag(start).items()}))
        .groupBy("key", (F.col("ts") - F.pmod("ts", F.lit(10_000))).alias("window_start"))
        .agg(F.count(F.lit(1)).alias("count")).collect())
    out = spark.read.parquet(str(tmp_path / "out")).select("key", "window_start", "count")
    got = sorted(tuple(r) for r in out.collect())
    assert len(got) == len(expected), "every window fired, once, and its output was committed"
    assert got == expected
