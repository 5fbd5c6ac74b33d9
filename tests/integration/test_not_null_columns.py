"""A pipeline whose PySpark steps make a column NOT NULL in Spark's eyes (a filter on it,
`auction % 123 = 0`) runs like any other. Spark's Arrow batches inside mapInArrow label
every column nullable whatever the DataFrame's schema says, so reading them under the
schema's NOT NULL failed every epoch with "ArrowInvalid: Schema at index 0 was different"."""

from __future__ import annotations

import json

import pyarrow.dataset as ds
import pytest

from sparkpoint import FileSource, KeyedAggregate, ParquetSink, Pipeline, Settings
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus

pytestmark = pytest.mark.spark

ROWS = [{"key": k % 9, "value": k} for k in range(300)]


def _settings(tmp_path):
    return Settings.load(overrides={
        "pipeline.name": "not-null", "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "execution.checkpointing.interval": "1 s",
        "sparkpoint.progress": False, "rest.enabled": False, "restart-strategy.type": "none"})


def _source(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "0.json").write_text("\n".join(json.dumps(r) for r in ROWS))
    return FileSource(str(inbox), format="json", schema="key BIGINT, value BIGINT", bounded=True)


def _output(tmp_path):
    return ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive",
                      ignore_prefixes=["_", "."]).to_table().to_pylist()


def test_a_stateless_pipeline_filtering_on_a_column_writes_its_rows(spark, tmp_path):
    pipeline = (Pipeline("not-null").source(_source(tmp_path))
                .transform(lambda df: df.where("key % 3 = 0").select("key", "value"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    result = JobMaster(pipeline, _settings(tmp_path), spark=spark).run()
    assert result.status == JobStatus.FINISHED
    assert sorted((r["key"], r["value"]) for r in _output(tmp_path)) == \
        sorted((r["key"], r["value"]) for r in ROWS if r["key"] % 3 == 0)


def test_a_stateful_step_keyed_by_a_filtered_column_counts_its_rows(spark, tmp_path):
    pipeline = (Pipeline("not-null").source(_source(tmp_path))
                .transform(lambda df: df.where("key % 3 = 0"))
                .stateful(KeyedAggregate("counts", ["key"], "value", aggs=("count",), value_type="bigint"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    result = JobMaster(pipeline, _settings(tmp_path), spark=spark).run()
    assert result.status == JobStatus.FINISHED
    final = {r["key"]: r["count"] for r in sorted(_output(tmp_path), key=lambda r: r["epoch"])}
    assert final == {0: 34, 3: 33, 6: 33}
