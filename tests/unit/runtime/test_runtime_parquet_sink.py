"""The exactly-once file sink's commit protocol, step by step (no Spark needed)."""

import pyarrow as pa
import pyarrow.dataset as ds

from sparkpoint.connectors.parquet_sink import ParquetSink


def committed(path):
    d = ds.dataset(str(path), format="parquet", partitioning="hive", ignore_prefixes=["_", "."])
    return sorted(d.to_table().column("x").to_pylist())


def rows(*xs):
    return pa.table({"x": list(xs)})


def test_staged_output_is_invisible_until_commit(tmp_path):
    sink = ParquetSink(tmp_path / "out")
    sink.open("j")
    sink.recover(None)
    sink.write_epoch(0, rows(1, 2))
    sink.write_epoch(1, rows(3))
    handle = sink.pre_commit(1)
    assert handle["epochs"] == [0, 1]
    assert sink.committed_epochs() == []
    sink.commit(handle)
    assert committed(tmp_path / "out") == [1, 2, 3]
    sink.commit(handle)  # re-run (recovery): idempotent
    assert committed(tmp_path / "out") == [1, 2, 3]


def test_epochs_of_a_failed_checkpoint_ride_with_the_next(tmp_path):
    sink = ParquetSink(tmp_path / "out")
    sink.recover(None)
    sink.write_epoch(0, rows(1))
    failed = sink.pre_commit(1)
    sink.abort(failed)
    sink.write_epoch(1, rows(2))
    nxt = sink.pre_commit(2)
    assert nxt["epochs"] == [0, 1]
    sink.commit(nxt)
    assert committed(tmp_path / "out") == [1, 2]


def test_recover_commits_the_restored_checkpoint_and_drops_later_work(tmp_path):
    """A crash after `_metadata` but before commit: recovery publishes that checkpoint's
    epochs; epochs staged after it are discarded (they will be re-run)."""
    sink = ParquetSink(tmp_path / "out")
    sink.recover(None)
    sink.write_epoch(0, rows(1))
    handle = sink.pre_commit(1)
    sink.write_epoch(1, rows(2))  # after the barrier; dies with the process
    fresh = ParquetSink(tmp_path / "out")
    fresh.recover(handle)
    assert committed(tmp_path / "out") == [1]
    assert not any((tmp_path / "out" / "_staging").iterdir())


def test_recover_to_an_older_checkpoint_removes_newer_committed_epochs(tmp_path):
    sink = ParquetSink(tmp_path / "out")
    sink.recover(None)
    sink.write_epoch(0, rows(1))
    old = sink.pre_commit(1)
    sink.commit(old)
    sink.write_epoch(1, rows(2))
    sink.commit(sink.pre_commit(2))
    assert committed(tmp_path / "out") == [1, 2]
    ParquetSink(tmp_path / "out").recover(old)  # checkpoint 2 turned out corrupt
    assert committed(tmp_path / "out") == [1]


def test_empty_epochs_write_nothing(tmp_path):
    sink = ParquetSink(tmp_path / "out")
    sink.recover(None)
    sink.write_epoch(0, rows())
    assert sink.pre_commit(1)["epochs"] == []
