"""The window kinds' Spark pre-aggregation, then `apply`, on real DataFrames: the
partials Spark builds per (key, pane) and per (key, session) of each epoch, merged
across epochs in state, give what Spark's own batch `window` / `session_window` give
over all the events (and what the window step gives on the raw rows)."""

from __future__ import annotations

import random

import pandas as pd
import pytest
from pyspark.sql import functions as F

from sparkpoint import CumulateWindow, SessionWindow, SlidingWindow
from sparkpoint.testing import ProcessorTester

AGGS = ("count", "sum", "min", "max", "avg")


def events(seed: int = 11, n: int = 300) -> pd.DataFrame:
    rnd = random.Random(seed)
    return pd.DataFrame({"k": [rnd.choice("abcd") for _ in range(n)],
                         "ts": [rnd.randrange(0, 120_000) // 100 * 100 for _ in range(n)],
                         "v": [None if rnd.random() < 0.1 else float(rnd.randrange(-20, 50)) for _ in range(n)],
                         "gap": [rnd.choice([700, 2_000, 5_000]) for _ in range(n)]}).astype({"ts": "int64"})


def epochs_of(df: pd.DataFrame, parts: int = 3) -> list[pd.DataFrame]:
    """The events in `parts` epochs, out of event-time order across epochs."""
    shuffled = df.sample(frac=1.0, random_state=5).reset_index(drop=True)
    return [shuffled.iloc[i::parts].reset_index(drop=True) for i in range(parts)]


def run_pre_aggregated(spark, make_step, epochs: list[pd.DataFrame], time_type: str = "bigint") -> pd.DataFrame:
    """Each epoch reduced by the step's `pre_aggregate` in Spark, then applied; all fire
    at the end. With `time_type="timestamp"` the event time is a Spark TIMESTAMP."""
    step = make_step()
    tester = ProcessorTester(step)
    for rows in epochs:
        df = spark.createDataFrame(rows, "k string, ts bigint, v double, gap bigint")
        if time_type == "timestamp":
            df = df.withColumn("ts", F.timestamp_millis("ts"))
        step.resolve_input_schema(df.limit(0).toArrow().schema)  # the driver's part: the time column's kind
        partials = step.pre_aggregate(df).toArrow()
        assert partials.num_rows < len(rows)  # Spark reduced the rows before state
        tester.process(partials)
    return canonical(tester.finish())


def run_raw(make_step, epochs: list[pd.DataFrame]) -> pd.DataFrame:
    tester = ProcessorTester(make_step())
    for rows in epochs:
        tester.process(rows)
    return canonical(tester.finish())


def canonical(df: pd.DataFrame) -> pd.DataFrame:
    """Window bounds as epoch ms (timestamps in, timestamps out), rows in order."""
    cols = ["k", "window_start", "window_end", *AGGS]
    df = df.copy()
    for bound in ("window_start", "window_end"):
        if pd.api.types.is_datetime64_any_dtype(df[bound]):
            df[bound] = (df[bound] - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)
    return df[cols].sort_values(["k", "window_start", "window_end"]).reset_index(drop=True)


def spark_batch(spark, df: pd.DataFrame, window) -> pd.DataFrame:
    sdf = spark.createDataFrame(df, "k string, ts bigint, v double, gap bigint") \
        .withColumn("t", F.timestamp_millis("ts"))
    out = sdf.groupBy("k", window(F.col("t")).alias("w")).agg(
        F.count(F.lit(1)).alias("count"), F.sum("v").alias("sum"), F.min("v").alias("min"), F.max("v").alias("max"),
        F.avg("v").alias("avg"))
    out = out.select("k", F.unix_millis("w.start").alias("window_start"), F.unix_millis("w.end").alias("window_end"),
                     *AGGS)
    return canonical(out.toPandas())


KINDS = {
    "sliding": (lambda: SlidingWindow("hop", ["k"], "ts", size="10 s", slide="4 s", aggs=AGGS, value_column="v"),
                lambda t: F.window(t, "10 seconds", "4 seconds")),
    "session": (lambda: SessionWindow("sessions", ["k"], "ts", gap="2 s", aggs=AGGS, value_column="v"),
                lambda t: F.session_window(t, "2 seconds")),
    "session-gap-column": (
        lambda: SessionWindow("sessions", ["k"], "ts", gap_column="gap", aggs=AGGS, value_column="v"),
        lambda t: F.session_window(t, F.concat(F.col("gap").cast("string"), F.lit(" milliseconds")))),
    "cumulate": (lambda: CumulateWindow("cumulate", ["k"], "ts", step="5 s", size="20 s", aggs=AGGS,
                                        value_column="v"), None),
}


@pytest.mark.parametrize("time_type", ["bigint", "timestamp"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_spark_partials_merged_across_epochs_equal_spark_batch_windows_and_the_raw_rows(spark, kind: str,
                                                                                        time_type: str) -> None:
    make_step, spark_window = KINDS[kind]
    df = events()
    epochs = epochs_of(df)
    got = run_pre_aggregated(spark, make_step, epochs, time_type)
    assert len(got) > 20
    pd.testing.assert_frame_equal(got, run_raw(make_step, epochs), check_dtype=False)
    if spark_window is not None:  # Spark has no cumulate window; the tests against a brute-force reference cover it
        pd.testing.assert_frame_equal(got, spark_batch(spark, df, spark_window), check_dtype=False)


@pytest.mark.parametrize("kind", ["sliding", "session"])
def test_a_job_with_a_window_step_emits_each_window_once_as_spark_batch_computes_it(spark, tmp_path, kind: str) -> None:
    """The runtime's own epochs (pre-aggregation with its carried columns, key groups,
    watermark, final epoch) on a generated stream whose disorder stays within the
    watermark's delay: every window once, equal to Spark's batch windows of all events."""
    import pyarrow.dataset as ds

    from sparkpoint import GeneratorSource, ParquetSink, Pipeline, Settings
    from sparkpoint.connectors.base import SlicePlan, SourceContext
    from sparkpoint.runtime.jobmaster import JobMaster
    from sparkpoint.runtime.status import JobStatus

    step, window = {
        "sliding": (SlidingWindow("hop", ["key"], "ts", size=200, slide=50, aggs=AGGS, value_column="value"),
                    lambda t: F.window(t, "200 milliseconds", "50 milliseconds")),
        "session": (SessionWindow("sessions", ["key"], "ts", gap=15, aggs=AGGS, value_column="value"),
                    lambda t: F.session_window(t, "15 milliseconds")),
    }[kind]
    source = GeneratorSource("ev", keys=30, total_events=12_000, max_records_per_epoch=3_000, disorder_ms=50)
    pipeline = (Pipeline("windows").source(source).watermark("ts", "100 ms").stateful(step)
                .sink(ParquetSink(str(tmp_path / "out"))))
    settings = Settings.load(overrides={
        "pipeline.name": "windows", "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "execution.checkpointing.interval": "500 ms",
        "sparkpoint.progress": False, "restart-strategy.type": "none"})
    result = JobMaster(pipeline, settings, spark=spark).run()
    assert result.status == JobStatus.FINISHED

    out = ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive",
                     ignore_prefixes=["_", "."]).to_table().to_pandas()
    assert not out["late"].any()
    got = out[["key", "window_start", "window_end", *AGGS]].sort_values(["key", "window_start", "window_end"]) \
        .reset_index(drop=True)
    source.open(SourceContext(spark, "ref"))
    events = source.read(SlicePlan({"0": 0, "1": 0}, {"0": 6_000, "1": 6_000})) \
        .withColumn("t", F.timestamp_millis("ts"))
    ref = events.groupBy("key", window(F.col("t")).alias("w")).agg(
        F.count(F.lit(1)).alias("count"), F.sum("value").alias("sum"), F.min("value").alias("min"),
        F.max("value").alias("max"), F.avg("value").alias("avg"))
    ref = ref.select("key", F.unix_millis("w.start").alias("window_start"), F.unix_millis("w.end").alias("window_end"),
                     *AGGS).toPandas().sort_values(["key", "window_start", "window_end"]).reset_index(drop=True)
    assert len(ref) > 100
    pd.testing.assert_frame_equal(got, ref, check_dtype=False)
