"""The Parquet sink's commit protocol step by step, without Spark: executors are played by
calling a pickled copy of the sink's writer, a crash by not calling the next step and
starting a fresh sink on the same directory. Runs on local disk and on fsspec's
in-memory filesystem (the object-store code path: copy, no rename, no fsync). What every
sink must do (abort, re-commit, recover, restore) is in tests/contracts/test_sink_contract.py;
this file checks what is Parquet's own: handles, log batches, compaction, staging clean-up."""

from __future__ import annotations

import json
import os
import uuid

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from pyspark import cloudpickle  # what Spark ships the writer with

from sparkpoint.connectors.parquet_sink import ParquetSink, read_committed
from sparkpoint.connectors.spark_file_log import LOG_DIR, SparkFileLog
from sparkpoint.errors import ConfigError, CorruptCheckpointError


@pytest.fixture(params=["local", "memory"])
def out(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "out dir")  # a space: log URIs are percent-encoded
    return f"memory://sparkpoint-out-{uuid.uuid4().hex}"


def new_sink(out: str) -> ParquetSink:
    sink = ParquetSink(out)
    sink.open("job")
    return sink


def rows(*xs: int) -> pa.Table:
    return pa.table({"x": pa.array(xs, pa.int64())})


def run_epoch(sink: ParquetSink, epoch: int, *parts: tuple[int, ...]) -> list[dict]:
    """One epoch on 'executors': each part is one task's rows, written by a shipped copy
    of the writer; the driver gets the handles only."""
    writer = cloudpickle.loads(cloudpickle.dumps(sink.epoch_writer()))
    handles = [h for part, xs in enumerate(parts) for h in writer.write(epoch, part, rows(*xs))]
    json.dumps(handles)  # handles travel as JSON
    sink.stage_epoch(epoch, handles)
    return handles


def committed(out: str) -> list[int]:
    return sorted(read_committed(out).column("x").to_pylist()) if ParquetSink(out).committed_files() else []


def listed(out: str) -> list[int]:
    """What a plain reader that lists the directory (skipping `_` and `.` entries) sees."""
    if "://" in out:
        return committed(out)
    d = ds.dataset(out, format="parquet", partitioning="hive", ignore_prefixes=["_", "."])
    return sorted(d.to_table().column("x").to_pylist()) if d.files else []


def batches(out: str) -> list[str]:
    sink = ParquetSink(out)
    return sorted(sink._storage.ls(f"{sink.root}/{LOG_DIR}"), key=lambda n: int(n.split(".")[0]))


def staged(out: str) -> list[str]:
    sink = ParquetSink(out)
    return [f.path for f in sink._storage.find(f"{sink.root}/_staging")]


# -- the writer -------------------------------------------------------------------------------
def test_writer_stages_one_durable_file_per_attempt_and_returns_its_handle(out):
    sink = new_sink(out)
    writer = cloudpickle.loads(cloudpickle.dumps(sink.epoch_writer()))
    first = writer.write(12, 1, rows(1, 2, 3))
    retry = writer.write(12, 1, rows(1, 2, 3))  # Spark re-ran the task: a name of its own
    assert writer.write(12, 0, rows()) == []     # no rows, no file
    [h], [h2] = first, retry
    assert h["epoch"] == 12 and h["part"] == 1 and h["rows"] == 3
    assert h["path"].startswith("_staging/epoch=00000012/part-00001-") and h["path"].endswith(".parquet")
    assert h["path"] != h2["path"]
    storage = sink._storage
    path = f"{sink.root}/{h['path']}"
    assert storage.size(path) == h["size"] and storage.sha256(path) == h["sha256"]
    assert sink.committed_epochs() == [] and committed(out) == [] and listed(out) == []


def test_staged_output_is_invisible_until_commit_and_commit_is_idempotent(out):
    sink = new_sink(out)
    sink.recover(None)
    run_epoch(sink, 0, (1, 2), (3,))
    run_epoch(sink, 1, (), (4,))
    sink.stage_epoch(2, [])  # an epoch without output
    handle = sink.pre_commit(1)
    assert handle["last_epoch"] == 2 and [f["epoch"] for f in handle["staged"]] == [0, 0, 1]
    json.dumps(handle)
    assert sink.committed_epochs() == [] and committed(out) == []
    sink.commit(handle)
    assert committed(out) == listed(out) == [1, 2, 3, 4]
    assert sink.committed_epochs() == [0, 1]
    sink.commit(handle)                   # retried commit
    ParquetSink(out).commit(handle)       # recovery re-running it from another process
    assert committed(out) == listed(out) == [1, 2, 3, 4]
    assert batches(out) == ["0"]
    assert staged(out) == []


def test_a_later_checkpoint_committed_first_subsumes_the_earlier_one(out):
    sink = new_sink(out)
    sink.recover(None)
    run_epoch(sink, 0, (1,))
    first = sink.pre_commit(1)
    run_epoch(sink, 1, (2,))
    second = sink.pre_commit(2)  # commit(first) has not run yet: its files ride along
    sink.commit(second)
    sink.commit(first)
    assert committed(out) == listed(out) == [1, 2]
    assert batches(out) == ["0"]


def test_write_epoch_on_the_driver_still_works(out):
    sink = new_sink(out)
    sink.recover(None)
    sink.write_epoch(0, rows(7, 8))
    sink.write_epoch(1, rows())
    handle = sink.pre_commit(1)
    assert handle["last_epoch"] == 1 and len(handle["staged"]) == 1
    sink.commit(handle)
    assert committed(out) == [7, 8]


# -- a crash at each step ---------------------------------------------------------------------
def test_crash_before_the_barrier_leaves_nothing_visible(out):
    sink = new_sink(out)
    sink.recover(None)
    run_epoch(sink, 0, (1,))
    cp1 = sink.pre_commit(1)
    sink.commit(cp1)
    run_epoch(sink, 1, (2,))                                             # staged, then the process dies
    sink.epoch_writer().write(2, 0, rows(3))                             # a task whose epoch never finished
    fresh = new_sink(out)
    fresh.recover(cp1)
    assert committed(out) == listed(out) == [1]
    assert staged(out) == []
    assert fresh.pre_commit(2)["staged"] == [] and fresh.pre_commit(2)["last_epoch"] == 0


def test_crash_after_metadata_before_commit_is_committed_by_recover(out):
    sink = new_sink(out)
    sink.recover(None)
    run_epoch(sink, 0, (1,), (2,))
    cp1 = sink.pre_commit(1)
    run_epoch(sink, 1, (9,))  # after the barrier: dies with the process
    fresh = new_sink(out)
    fresh.recover(json.loads(json.dumps(cp1)))  # as read back from `_metadata`
    assert committed(out) == listed(out) == [1, 2]
    assert staged(out) == [] and batches(out) == ["0"]


@pytest.mark.parametrize("published", [0, 1, 2])
def test_crash_inside_commit_is_finished_by_recover(out, monkeypatch, published):
    """The commit died after publishing `published` of the two files, before its log
    batch: Spark readers saw nothing, and recovery finishes it exactly once."""
    sink = new_sink(out)
    sink.recover(None)
    run_epoch(sink, 0, (1,), (2,))
    cp1 = sink.pre_commit(1)
    calls = {"n": 0}
    real_publish, real_append = ParquetSink._move_file, SparkFileLog.append

    def publish(self, *a):
        if calls["n"] == published:
            raise RuntimeError("killed")
        calls["n"] += 1
        return real_publish(self, *a)

    def append(self, *a):
        raise RuntimeError("killed")

    monkeypatch.setattr(ParquetSink, "_move_file", publish)
    monkeypatch.setattr(SparkFileLog, "append", append)
    with pytest.raises(RuntimeError):
        sink.commit(cp1)
    assert committed(out) == []
    monkeypatch.setattr(ParquetSink, "_move_file", real_publish)
    monkeypatch.setattr(SparkFileLog, "append", real_append)
    new_sink(out).recover(cp1)
    assert committed(out) == listed(out) == [1, 2]
    assert batches(out) == ["0"]


def test_a_commit_that_published_but_was_never_logged_is_removed_when_restore_goes_older(out, monkeypatch):
    sink = new_sink(out)
    sink.recover(None)
    run_epoch(sink, 0, (1,))
    cp1 = sink.pre_commit(1)
    sink.commit(cp1)
    run_epoch(sink, 1, (2,))
    cp2 = sink.pre_commit(2)
    monkeypatch.setattr(SparkFileLog, "append", lambda *a: (_ for _ in ()).throw(RuntimeError("killed")))
    with pytest.raises(RuntimeError):
        sink.commit(cp2)  # file of epoch 1 published, not logged
    monkeypatch.undo()
    new_sink(out).recover(cp1)  # checkpoint 2 turned out corrupt
    assert committed(out) == listed(out) == [1]


# -- a restore that falls back to an older checkpoint -----------------------------------------
def test_recover_to_an_older_checkpoint_withdraws_later_output(out):
    sink = new_sink(out)
    sink.recover(None)
    run_epoch(sink, 0, (1,))
    cp1 = sink.pre_commit(1)
    sink.commit(cp1)
    run_epoch(sink, 1, (2,))
    run_epoch(sink, 2, (3,))
    sink.commit(sink.pre_commit(2))
    assert committed(out) == [1, 2, 3]
    fresh = new_sink(out)
    fresh.recover(cp1)  # checkpoint 2 turned out corrupt
    assert committed(out) == listed(out) == [1]
    assert fresh.committed_epochs() == [0]
    assert batches(out) == ["0", "1", *map(str, range(2, 9)), "9.compact"]
    # The job carries on from epoch 1 and produces it again (differently, say).
    run_epoch(fresh, 1, (20,))
    fresh.commit(fresh.pre_commit(3))
    assert committed(out) == listed(out) == [1, 20]
    assert batches(out)[-1] == "10"


def test_fallback_after_compaction_rewrites_the_next_compact_batch(out):
    sink = new_sink(out)
    sink.recover(None)
    handles = {}
    for cid in range(1, 15):  # batches 0..13; 9.compact holds batches 0..9
        run_epoch(sink, cid - 1, (cid,))
        handles[cid] = sink.pre_commit(cid)
        sink.commit(handles[cid])
    assert "9.compact" in batches(out) and committed(out) == list(range(1, 15))
    new_sink(out).recover(handles[5])
    assert committed(out) == listed(out) == [1, 2, 3, 4, 5]
    names = batches(out)
    assert names[-1] == "19.compact" and "9.compact" in names
    # Recovering the same checkpoint again changes nothing and writes nothing.
    new_sink(out).recover(handles[5])
    assert batches(out) == names and committed(out) == [1, 2, 3, 4, 5]


def test_old_log_batches_are_cleaned_up_keeping_two_compact_batches(out):
    sink = new_sink(out)
    sink.recover(None)
    for cid in range(1, 31):  # batches 0..29
        run_epoch(sink, cid - 1, (cid,))
        sink.commit(sink.pre_commit(cid))
    names = batches(out)
    assert names[0] == "19.compact" and names[-1] == "29.compact" and len(names) == 11
    assert committed(out) == list(range(1, 31))


def test_fresh_start_with_restore_mode_empty_withdraws_everything(out):
    sink = new_sink(out)
    sink.recover(None)
    run_epoch(sink, 0, (1,))
    sink.commit(sink.pre_commit(1))
    new_sink(out).recover(None)
    assert committed(out) == listed(out) == []
    assert ParquetSink(out).committed_epochs() == []


# -- handles read back from a checkpoint are untrusted ----------------------------------------
@pytest.mark.parametrize("path", [
    "../elsewhere/epoch=00000000/part-00000-" + "0" * 32 + ".parquet",
    "_staging/../../etc/epoch=00000000/part-00000-" + "0" * 32 + ".parquet",
    "/etc/passwd",
    "epoch=00000000/part-00000-" + "0" * 32 + ".parquet",
    "_staging/epoch=00000001/part-00000-" + "0" * 32 + ".parquet",  # epoch does not match
])
def test_a_handle_with_a_path_outside_the_staging_area_is_refused(out, path):
    bad = {"v": 1, "checkpoint": 3, "last_epoch": 0,
           "staged": [{"epoch": 0, "part": 0, "path": path, "size": 1, "sha256": "0" * 64, "rows": 1}]}
    with pytest.raises(CorruptCheckpointError, match="path"):
        new_sink(out).recover(bad)
    with pytest.raises(CorruptCheckpointError):
        new_sink(out).commit(bad)


def test_a_handle_of_another_format_is_refused(out):
    with pytest.raises(CorruptCheckpointError, match="not one this version writes"):
        new_sink(out).recover({"epochs": [0], "last_epoch": 0, "path": "/x"})


# -- paths and the log format -----------------------------------------------------------------
def test_an_s3_url_is_never_a_local_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sink = ParquetSink("s3://bucket/prefix/", storage_options={"anon": True})
    assert sink.path == "s3://bucket/prefix" and sink.root == "bucket/prefix" and sink.spark_scheme == "s3a"
    assert sink.epoch_writer().url == "s3://bucket/prefix"
    assert sink._log.uri("epoch=00000001/p.parquet") == "s3a://bucket/prefix/epoch=00000001/p.parquet"
    with pytest.raises(ConfigError, match="s3://bucket/prefix"):
        ParquetSink("s3:/bucket/prefix")
    assert os.listdir(tmp_path) == []
    assert ParquetSink("relative/out").path == str(tmp_path / "relative" / "out")


def test_log_batches_are_in_spark_file_sink_format(tmp_path):
    out = tmp_path / "out"
    sink = new_sink(str(out))
    sink.recover(None)
    run_epoch(sink, 3, (1,), (2,))
    sink.commit(sink.pre_commit(1))
    text = (out / LOG_DIR / "0").read_text()
    lines = text.split("\n")
    assert lines[0] == "v1" and len(lines) == 3 and not text.endswith("\n")
    entry = json.loads(lines[1])
    assert set(entry) == {"path", "size", "isDir", "modificationTime", "blockReplication", "blockSize", "action"}
    assert entry["path"].startswith(f"file://{out}/epoch=00000003/part-0000")
    assert entry["action"] == "add" and entry["isDir"] is False
    assert entry["size"] == os.path.getsize(entry["path"][len("file://"):])


def test_committed_epochs_of_an_output_without_a_log(tmp_path):
    (tmp_path / "out" / "epoch=00000004").mkdir(parents=True)
    assert ParquetSink(tmp_path / "out").committed_epochs() == [4]
    assert ParquetSink(tmp_path / "empty").committed_epochs() == []
