"""The Parquet sink on an S3 API (moto server on 127.0.0.1): no rename anywhere, commits are
copies plus an exclusively created log batch, and the output read back by following the
log (as Spark's `spark.read.parquet("s3a://...")` does) is exactly the committed rows,
also after a half-done commit and after a restore that fell back to an older checkpoint.

Spark itself reads s3a:// only with the hadoop-aws jars, which this environment lacks;
the Spark-side reading of the same log format is covered on local disk by
tests/integration/test_parquet_sink_spark.py."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from sparkpoint.connectors.parquet_sink import ParquetSink, read_committed
from sparkpoint.connectors.spark_file_log import LOG_DIR, SparkFileLog

pytestmark = pytest.mark.s3


@pytest.fixture
def url(s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/output"


def new_sink(url: str, options: dict) -> ParquetSink:
    sink = ParquetSink(url, storage_options=options)
    sink.open("job")
    return sink


def stage(sink: ParquetSink, epoch: int, *parts: list[int]) -> list[dict]:
    writer = cloudpickle.loads(cloudpickle.dumps(sink.epoch_writer()))  # as shipped to an executor
    handles = [h for part, xs in enumerate(parts)
               for h in writer.write(epoch, part, pa.table({"x": pa.array(xs, pa.int64())}))]
    sink.stage_epoch(epoch, json.loads(json.dumps(handles)))
    return handles


def rows(url: str, options: dict) -> list[tuple[int, int]]:
    table = read_committed(url, options)
    if table.num_rows == 0:
        return []
    return sorted(zip(table.column("epoch").to_pylist(), table.column("x").to_pylist()))


def data_files(sink: ParquetSink) -> list[str]:
    return sorted(f.path.split(sink.root + "/", 1)[1] for f in sink._storage.find(sink.root)
                  if not f.path.split(sink.root + "/", 1)[1].startswith(("_spark_metadata", "_staging")))


def test_commit_on_s3_publishes_by_copy_and_one_log_batch(url, s3_options):
    sink = new_sink(url, s3_options)
    sink.recover(None)
    stage(sink, 0, [1, 2], [3])
    stage(sink, 1, [], [4])
    handle = sink.pre_commit(1)
    assert rows(url, s3_options) == [] and sink.committed_epochs() == []
    sink.commit(handle)
    sink.commit(handle)  # idempotent
    assert rows(url, s3_options) == [(0, 1), (0, 2), (0, 3), (1, 4)]
    assert sink._storage.ls(f"{sink.root}/{LOG_DIR}") == ["0"]
    assert sink._storage.find(f"{sink.root}/_staging") == []
    batch = sink._storage.read_bytes(f"{sink.root}/{LOG_DIR}/0").decode().split("\n")
    assert batch[0] == "v1"
    assert all(json.loads(line)["path"].startswith(f"s3a://{url[len('s3://'):]}/epoch=0000000") for line in batch[1:])
    assert len(data_files(sink)) == 3 == len(sink.committed_files())


def test_a_half_done_commit_on_s3_is_finished_by_recover(url, s3_options, monkeypatch):
    sink = new_sink(url, s3_options)
    sink.recover(None)
    stage(sink, 0, [1], [2])
    cp1 = sink.pre_commit(1)
    monkeypatch.setattr(SparkFileLog, "append", lambda *a: (_ for _ in ()).throw(RuntimeError("killed")))
    with pytest.raises(RuntimeError):
        sink.commit(cp1)  # both files copied, no log batch
    monkeypatch.undo()
    assert rows(url, s3_options) == []
    stage(sink, 1, [9])  # after the barrier; dies with the process
    new_sink(url, s3_options).recover(json.loads(json.dumps(cp1)))
    assert rows(url, s3_options) == [(0, 1), (0, 2)]
    assert len(data_files(sink)) == 2


def test_a_restore_to_an_older_checkpoint_on_s3_withdraws_later_output(url, s3_options):
    sink = new_sink(url, s3_options)
    sink.recover(None)
    handles = {}
    for cid in range(1, 12):  # crosses the compaction at batch 9
        stage(sink, cid - 1, [cid])
        handles[cid] = sink.pre_commit(cid)
        sink.commit(handles[cid])
    fresh = new_sink(url, s3_options)
    fresh.recover(handles[4])
    assert rows(url, s3_options) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert len(data_files(fresh)) == 4  # the withdrawn files are deleted, not just unlisted
    assert "19.compact" in fresh._storage.ls(f"{fresh.root}/{LOG_DIR}")
    stage(fresh, 4, [50])
    fresh.commit(fresh.pre_commit(12))
    assert rows(url, s3_options) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 50)]
    assert fresh.committed_epochs() == [0, 1, 2, 3, 4]
