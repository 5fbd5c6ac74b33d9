"""Spark reads exactly the committed output of the Parquet sink: `spark.read.parquet(path)`
follows the sink's `_spark_metadata` log, also across a compaction of the log, after a
commit that died half-way, and after a restore that fell back to an older checkpoint."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark import cloudpickle

from sparkpoint.connectors.parquet_sink import ParquetSink, read_committed
from sparkpoint.connectors.spark_file_log import SparkFileLog

pytestmark = pytest.mark.spark


def stage(sink: ParquetSink, epoch: int, *parts: list[int]) -> None:
    writer = cloudpickle.loads(cloudpickle.dumps(sink.epoch_writer()))
    sink.stage_epoch(epoch, [h for part, xs in enumerate(parts)
                             for h in writer.write(epoch, part, pa.table({"x": pa.array(xs, pa.int64())}))])


def spark_rows(spark, path) -> list[tuple[int, int]]:
    df = spark.read.parquet(str(path))
    assert dict(df.dtypes)["epoch"] == "int"
    return sorted((r.epoch, r.x) for r in df.select("epoch", "x").collect())


def expected(epochs: dict[int, list[int]]) -> list[tuple[int, int]]:
    return sorted((e, x) for e, xs in epochs.items() for x in xs)


def test_spark_reads_exactly_the_committed_files(spark, tmp_path, monkeypatch):
    out = tmp_path / "out dir"  # a space: the log's URIs are percent-encoded
    sink = ParquetSink(out)
    sink.open("job")
    sink.recover(None)
    produced: dict[int, list[int]] = {}
    handles = {}
    for cid in range(1, 13):  # 12 log batches: 9.compact holds the first ten
        epoch = cid - 1
        produced[epoch] = [10 * epoch, 10 * epoch + 1]
        stage(sink, epoch, produced[epoch][:1], [], produced[epoch][1:])
        handles[cid] = sink.pre_commit(cid)
        sink.commit(handles[cid])
    # Output Spark must not see: an epoch staged after the last barrier, and a commit
    # that published its file but died before its log batch.
    stage(sink, 12, [999])
    doomed = sink.pre_commit(13)
    monkeypatch.setattr(SparkFileLog, "append", lambda *a: (_ for _ in ()).throw(RuntimeError("killed")))
    with pytest.raises(RuntimeError):
        sink.commit(doomed)
    monkeypatch.undo()
    assert any(out.glob("epoch=00000012/*.parquet"))
    stage(sink, 13, [998])
    assert spark_rows(spark, out) == expected(produced)
    table = read_committed(str(out))
    assert sorted(zip(table.column("epoch").to_pylist(), table.column("x").to_pylist())) == expected(produced)

    # The restore falls back to checkpoint 6 (7..13 turned out corrupt): epochs 6.. go.
    fresh = ParquetSink(out)
    fresh.open("job")
    fresh.recover(handles[6])
    kept = {e: xs for e, xs in produced.items() if e <= 5}
    assert spark_rows(spark, out) == expected(kept)
    # ... and are produced again, differently.
    stage(fresh, 6, [-6])
    stage(fresh, 7, [-7])
    fresh.commit(fresh.pre_commit(14))
    assert spark_rows(spark, out) == expected({**kept, 6: [-6], 7: [-7]})
    assert fresh.committed_epochs() == [0, 1, 2, 3, 4, 5, 6, 7]
