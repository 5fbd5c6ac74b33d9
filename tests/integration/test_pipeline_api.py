"""The public API on real Spark: StatefulProcessor pipelines, the file source."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow.dataset as ds
import pytest

from sparkpoint import FileSource, GeneratorSource, ParquetSink, Pipeline, ProcessorOperator, Settings, StatefulProcessor
from sparkpoint.connectors.base import SlicePlan, SourceContext
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus

pytestmark = pytest.mark.spark


class RunningCount(StatefulProcessor):
    """Counts events per key in value state; emits the running count once per epoch
    and, through an event-time timer, a final 'closed' row when the watermark passes
    the key's last event + 1 s."""

    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "n BIGINT")
        self.last_ts = handle.getValueState("last_ts", "ts BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        n = self.count.get()[0] if self.count.exists() else 0
        last = self.last_ts.get()[0] if self.last_ts.exists() else 0
        for pdf in rows:
            n += len(pdf)
            last = max(last, int(pdf["ts"].max()))
        self.count.update((n,))
        self.last_ts.update((last,))
        for t in self.handle.listTimers():
            self.handle.deleteTimer(t)
        self.handle.registerTimer(last + 1000)
        yield pd.DataFrame({"key": [key[0]], "n": [n], "closed": [False]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield pd.DataFrame({"key": [key[0]], "n": [self.count.get()[0]], "closed": [True]})
        self.count.clear()


def _settings(tmp_path, **extra):
    return Settings.load(overrides={
        "pipeline.name": "api", "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "execution.checkpointing.interval": "500 ms",
        "sparkpoint.progress": False, "restart-strategy.type": "none", **extra})


def test_stateful_processor_pipeline_counts_every_event_once(spark, tmp_path):
    source = GeneratorSource("ev", keys=40, total_events=60_000, max_records_per_epoch=10_000, disorder_ms=500)
    pipeline = (Pipeline("api").source(source).watermark("ts", "1 s")
                .stateful(ProcessorOperator("counts", RunningCount, ["key"], "key BIGINT, n BIGINT, closed BOOLEAN",
                                            time_mode="eventtime"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    result = JobMaster(pipeline, _settings(tmp_path), spark=spark).run()
    assert result.status == JobStatus.FINISHED
    assert result.completed_checkpoints >= 1

    out = ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive",
                     ignore_prefixes=["_", "."]).to_table().to_pandas()
    source.open(SourceContext(spark, "ref"))
    events = source.read(SlicePlan({"0": 0, "1": 0}, {"0": 30_000, "1": 30_000})).toPandas()
    expected = events.groupby("key").size().to_dict()
    closed = out[out.closed].set_index("key")["n"].to_dict()
    assert closed == expected                       # each key closed once, with its full count
    assert out[out.closed].key.is_unique


def test_file_source_reads_new_files_once_and_resumes_from_positions(spark, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()

    def drop(name, rows):
        tmp = inbox / f".{name}.tmp"
        tmp.write_text("\n".join(json.dumps(r) for r in rows))
        tmp.rename(inbox / name)  # complete files only appear

    src = FileSource(str(inbox), format="json", schema="key BIGINT, value BIGINT", max_files_per_epoch=2)
    src.open(SourceContext(spark, "files"))
    pos = src.initial_positions()
    assert src.plan(pos).empty
    drop("a.json", [{"key": 1, "value": 10}])
    drop("b.json", [{"key": 2, "value": 20}, {"key": 3, "value": 30}])
    drop("c.json", [{"key": 4, "value": 40}])
    plan = src.plan(pos)
    assert sorted(r.key for r in src.read(plan).collect()) == [1, 2, 3]  # two files per epoch
    pos = json.loads(json.dumps(plan.end))  # positions survive a JSON round trip (checkpoint metadata)
    assert src.lag(pos) == {"dir": 1}
    plan2 = FileSource(str(inbox), format="json", schema="key BIGINT, value BIGINT").plan(pos)
    src2 = FileSource(str(inbox), format="json", schema="key BIGINT, value BIGINT")
    src2.open(SourceContext(spark, "files"))
    assert [r.key for r in src2.read(plan2).collect()] == [4]
    assert src2.plan(plan2.end).empty


def test_generator_is_replayable(spark):
    g = GeneratorSource("ev", keys=100, total_events=1000)
    g.open(SourceContext(spark, "g"))
    plan = SlicePlan({"0": 100, "1": 100}, {"0": 200, "1": 200})
    a = sorted(map(tuple, g.read(plan).collect()))
    b = sorted(map(tuple, g.read(plan).collect()))
    assert a == b and len(a) == 200


def test_bad_starts_are_refused_with_one_clear_error_and_touch_no_output(spark, tmp_path):
    from sparkpoint import KeyedAggregate
    from sparkpoint.errors import ConfigError

    def pipeline(out):
        return (Pipeline("api").source(GeneratorSource("ev", keys=20, total_events=4_000,
                                                        max_records_per_epoch=2_000))
                .stateful(KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
                .sink(ParquetSink(str(out))))

    out = tmp_path / "out"
    assert JobMaster(pipeline(out), _settings(tmp_path), spark=spark).run().status == JobStatus.FINISHED
    committed = sorted(p.name for p in out.iterdir())

    # The checkpoints were taken with max parallelism 128 (key groups): restoring them
    # with another is refused (another parallelism is a rescale: tests/integration/test_savepoints_rescale.py).
    rescaled = JobMaster(pipeline(out), _settings(tmp_path, **{"pipeline.max-parallelism": 64}), spark=spark)
    with pytest.raises(ConfigError, match="max-parallelism=128.*--set pipeline.max-parallelism=128"):
        rescaled.run()
    assert refusals(rescaled) == {"CHANGED_MAX_PARALLELISM": 1}

    # Committed output but no checkpoint of this job (another checkpoint dir): refused, not mixed.
    elsewhere = JobMaster(pipeline(out), _settings(tmp_path, **{"execution.checkpointing.dir": str(tmp_path / "other")}),
                          spark=spark)
    with pytest.raises(ConfigError, match="already holds committed output"):
        elsewhere.run()
    assert refusals(elsewhere) == {"OUTPUT_WITHOUT_CHECKPOINT": 1}
    assert sorted(p.name for p in out.iterdir()) == committed


def refusals(job: JobMaster) -> dict[str, int]:
    """The job's restore refusals as its metrics export them, by reason."""
    registry = job.coordinator.stats.registry
    return {s.labels["reason"]: int(s.value) for metric in registry.collect()
            if metric.name == "sparkpoint_restore_refusals" for s in metric.samples
            if s.name.endswith("_total") and s.value}


def test_a_bounded_job_with_periodic_checkpoints_disabled_commits_its_output_once_and_finishes(spark, tmp_path):
    """The final checkpoint is forced: it must run although periodic checkpointing is off
    (a suspended coordinator used to refuse it forever and the job replayed its input)."""
    from sparkpoint import KeyedAggregate

    pipeline = (Pipeline("nockpt").source(GeneratorSource("g", keys=50, total_events=4_000, max_records_per_epoch=1_000))
                .stateful(KeyedAggregate("agg", ["key"], "value", value_type="bigint"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    result = JobMaster(pipeline, _settings(tmp_path, **{"execution.checkpointing.enabled": False}), spark=spark).run()
    assert result.status is JobStatus.FINISHED and result.restarts == 0
    assert result.completed_checkpoints == 1 and result.failed_checkpoints == 0
    rows = ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive").to_table().to_pylist()
    final = {}
    for r in sorted(rows, key=lambda r: r["epoch"]):
        final[r["key"]] = r["count"]
    assert sum(final.values()) == 4_000


@pytest.mark.parametrize("aggs", [("count", "sum"), ("sum", "min", "max")])
def test_keyed_aggregate_equals_sparks_group_by_for_each_set_of_aggs(spark, tmp_path, aggs):
    """pre_aggregate shuffles only the partials the aggs need; nulls still count as rows
    and not as values (SQL semantics), across epochs."""
    from pyspark.sql import functions as F

    from sparkpoint import KeyedAggregate

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    rows = [{"key": k % 7, "value": None if k % 5 == 0 or k % 7 == 3 else k * 3 % 101} for k in range(400)]
    for i in range(4):
        (inbox / f"{i}.json").write_text("\n".join(json.dumps(r) for r in rows[i * 100:(i + 1) * 100]))
    src = FileSource(str(inbox), format="json", schema="key BIGINT, value BIGINT", max_files_per_epoch=1,
                     bounded=True)
    pipeline = (Pipeline("aggs").source(src).stateful(KeyedAggregate("agg", ["key"], "value", aggs=aggs,
                                                                     value_type="bigint"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    result = JobMaster(pipeline, _settings(tmp_path), spark=spark).run()
    assert result.status is JobStatus.FINISHED

    out = ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive").to_table().to_pylist()
    final = {r["key"]: {a: r[a] for a in aggs} for r in sorted(out, key=lambda r: r["epoch"])}
    expected_df = spark.createDataFrame(rows, "key BIGINT, value BIGINT").groupBy("key").agg(
        *[(F.count(F.lit(1)) if a == "count" else getattr(F, a)("value")).alias(a) for a in aggs])
    expected = {r["key"]: {a: r[a] for a in aggs} for r in expected_df.collect()}
    assert final == expected
    assert all(v is None for a, v in expected[3].items() if a != "count"), "key 3 has only null values"
