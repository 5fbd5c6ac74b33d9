"""The Delta sink's commit protocol step by step, without Spark, on real directories (and
once on a local S3 API server): executors are played by a pickled copy of the sink's
writer, a crash by not calling the next step and opening a fresh sink on the same table.
What is checked is what a reader of the table sees, through delta-rs. What every sink
must do (abort, re-commit, recover, restore) is in tests/contracts/test_sink_contract.py;
this file checks what is Delta's own: the txn, versions, data files, schemas."""

from __future__ import annotations

import datetime
import json
import os
import uuid

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark import cloudpickle  # what Spark ships the writer with

from sparkpoint.connectors.delta_sink import DeltaSink, read_committed, translate_storage_options
from sparkpoint.errors import ConfigError, CorruptCheckpointError

JOB = "job"


@pytest.fixture
def out(tmp_path) -> str:
    return str(tmp_path / "table dir")  # a space: Delta paths are URL-encoded in the log


def new_sink(out: str, **kwargs) -> DeltaSink:
    sink = DeltaSink(out, **kwargs)
    sink.open(JOB)
    return sink


def rows(*xs: int) -> pa.Table:
    return pa.table({"x": pa.array(xs, pa.int64()), "s": pa.array([f"r{x}" for x in xs], pa.string())})


def run_epoch(sink: DeltaSink, epoch: int, *parts: tuple[int, ...]) -> list[dict]:
    """One epoch on 'executors': each part is one task's rows, written by a shipped copy
    of the writer; the driver gets the handles only."""
    writer = cloudpickle.loads(cloudpickle.dumps(sink.epoch_writer()))
    handles = [h for part, xs in enumerate(parts) for h in writer.write(epoch, part, rows(*xs))]
    json.dumps(handles)  # handles travel as JSON
    sink.stage_epoch(epoch, handles)
    return handles


def roundtrip(handle) -> dict:
    """What the restored checkpoint's `_metadata` gives back."""
    return json.loads(json.dumps(handle))


def committed(out: str) -> list[int]:
    return sorted(read_committed(out).column("x").to_pylist()) if DeltaTable.is_deltatable(out) else []


def data_files(out: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs
                  if f.endswith(".parquet") and "_delta_log" not in d)


def versions(out: str) -> int:
    return DeltaTable(out).version()


# -- the writer -------------------------------------------------------------------------------
def test_writer_writes_one_durable_file_per_attempt_and_returns_its_handle(out):
    sink = new_sink(out)
    writer = cloudpickle.loads(cloudpickle.dumps(sink.epoch_writer()))
    [h] = writer.write(12, 1, rows(1, 2, 3))
    [h2] = writer.write(12, 1, rows(1, 2, 3))  # Spark re-ran the task: a name of its own
    assert writer.write(12, 0, rows()) == []     # no rows, no file
    assert h["epoch"] == 12 and h["part"] == 1 and h["rows"] == 3 and h["path"] != h2["path"]
    assert h["path"].startswith("epoch-00000012/part-00001-") and h["path"].endswith(".parquet")
    assert os.path.getsize(os.path.join(out, h["path"])) == h["size"]
    assert h["schema"] == h2["schema"]
    assert not DeltaTable.is_deltatable(out), "writing data files commits nothing"


def test_timestamps_are_stored_in_microseconds_as_delta_requires(out):
    sink = new_sink(out)
    ts = [datetime.datetime(2024, 1, 1, 0, 0, 1), datetime.datetime(2024, 1, 1, 0, 0, 2)]
    table = pa.table({"k": ["a", "b"], "t": pa.array(ts, pa.timestamp("ns", tz="UTC")),
                      "w": pa.array(ts, pa.timestamp("ms"))})
    sink.stage_epoch(0, sink.epoch_writer().write(0, 0, table))
    sink.commit(roundtrip(sink.pre_commit(1)))
    got = DeltaTable(out).to_pyarrow_table().sort_by("k")
    assert got.schema.field("t").type == pa.timestamp("us", tz="UTC")
    assert got.schema.field("w").type == pa.timestamp("us")
    assert got.column("w").to_pylist() == ts


# -- commit -----------------------------------------------------------------------------------
def test_only_committed_checkpoints_are_visible_and_the_txn_records_the_checkpoint(out):
    sink = new_sink(out)
    run_epoch(sink, 0, (1, 2), (3,))
    handle = roundtrip(sink.pre_commit(1))
    run_epoch(sink, 1, (4,))  # after the barrier: belongs to the next checkpoint
    assert committed(out) == []
    sink.commit(handle)
    assert committed(out) == [1, 2, 3]
    assert DeltaTable(out).transaction_version(JOB) == 1
    assert sink.committed_epochs() == [0]
    sink.commit(roundtrip(sink.pre_commit(2)))
    assert committed(out) == [1, 2, 3, 4]
    assert DeltaTable(out).transaction_version(JOB) == 2
    info = DeltaTable(out).history(1)[0]
    assert info["sparkpoint.checkpoint"] == 2 and info["sparkpoint.lastEpoch"] == 1


def test_a_retried_commit_is_skipped_by_the_tables_txn(out):
    sink = new_sink(out)
    run_epoch(sink, 0, (1, 2))
    handle = roundtrip(sink.pre_commit(1))
    sink.commit(handle)
    version = versions(out)
    sink.commit(handle)                  # the committer retried
    new_sink(out).commit(handle)         # a new process re-ran it
    assert committed(out) == [1, 2]
    assert versions(out) == version, "a skipped commit writes no Delta version"


def test_losing_task_attempts_are_deleted_after_the_commit(out):
    sink = new_sink(out)
    writer = sink.epoch_writer()
    writer.write(0, 0, rows(1))           # an attempt Spark discarded
    [winner] = writer.write(0, 0, rows(1))
    sink.stage_epoch(0, [winner])
    sink.commit(roundtrip(sink.pre_commit(1)))
    assert committed(out) == [1]
    assert data_files(out) == [winner["path"]]


# -- crashes and recovery ---------------------------------------------------------------------
def test_crash_between_metadata_and_commit_recovery_commits_it_and_drops_later_epochs(out):
    sink = new_sink(out)
    run_epoch(sink, 0, (1, 2))
    sink.commit(roundtrip(sink.pre_commit(1)))
    run_epoch(sink, 1, (3,), (4,))
    handle = roundtrip(sink.pre_commit(2))  # `_metadata` of 2 is written, then the process dies
    run_epoch(sink, 2, (5,))                # an epoch after the barrier, never checkpointed
    sink.epoch_writer().write(1, 0, rows(3))  # a losing attempt of epoch 1

    again = new_sink(out)
    again.recover(handle)
    assert committed(out) == [1, 2, 3, 4]
    assert DeltaTable(out).transaction_version(JOB) == 2
    assert data_files(out) == again.committed_files(), "only committed data files remain"
    assert again.pre_commit(3)["files"] == [] and again.pre_commit(3)["last_epoch"] == 1


def test_crash_after_commit_recovery_changes_nothing(out):
    sink = new_sink(out)
    run_epoch(sink, 0, (1, 2))
    handle = roundtrip(sink.pre_commit(1))
    sink.commit(handle)
    version = versions(out)
    new_sink(out).recover(handle)
    assert committed(out) == [1, 2] and versions(out) == version


def test_restore_falling_back_past_a_committed_checkpoint_withdraws_its_output(out):
    """Checkpoint 2 committed epochs 2..3, then turned out unrestorable; the restore of
    checkpoint 1 produces epochs 2..3 again under later checkpoint ids. They must appear
    once, so the table must forget both 2's rows and its txn version."""
    sink = new_sink(out)
    run_epoch(sink, 0, (1,))
    run_epoch(sink, 1, (2,))
    h1 = roundtrip(sink.pre_commit(1))
    sink.commit(h1)
    run_epoch(sink, 2, (3,))
    run_epoch(sink, 3, (4,))
    sink.commit(roundtrip(sink.pre_commit(2)))
    assert committed(out) == [1, 2, 3, 4]

    again = new_sink(out)
    again.recover(h1)
    assert committed(out) == [1, 2]
    assert DeltaTable(out).transaction_version(JOB) == 1
    assert again.committed_epochs() == [0, 1] and data_files(out) == again.committed_files()
    run_epoch(again, 2, (3,))
    run_epoch(again, 3, (4,))
    again.commit(roundtrip(again.pre_commit(3)))
    assert committed(out) == [1, 2, 3, 4]


def test_fresh_start_withdraws_everything_and_resets_the_txn(out):
    """restore.mode=empty (or a new checkpoint directory with the runtime's consent):
    checkpoint ids may start at 1 again, so the recorded txn must not skip them."""
    sink = new_sink(out)
    run_epoch(sink, 0, (1,))
    sink.commit(roundtrip(sink.pre_commit(7)))
    assert sink.committed_epochs() == [0]
    again = new_sink(out)
    again.recover(None)
    assert committed(out) == [] and again.committed_epochs() == []
    assert DeltaTable(out).transaction_version(JOB) == 0
    run_epoch(again, 0, (1,))
    again.commit(roundtrip(again.pre_commit(1)))
    assert committed(out) == [1]


def test_recover_on_an_empty_directory_creates_nothing(out):
    new_sink(out).recover(None)
    assert not DeltaTable.is_deltatable(out) and data_files(out) == []


@pytest.mark.parametrize("bad", [
    {"v": 1, "checkpoint": 3, "last_epoch": 0, "files": [{"path": "../../etc/passwd"}]},
    {"v": 1, "checkpoint": 3, "last_epoch": 0,
     "files": [{"epoch": 0, "part": 0, "path": "/abs/epoch-00000000/part-00000-" + "a" * 32 + ".parquet",
                "size": 1, "rows": 1, "sha256": "0" * 64, "schema": "0" * 16}]},
    {"v": 1, "checkpoint": 3, "last_epoch": 0,
     "files": [{"epoch": 1, "part": 0, "path": "epoch-00000000/part-00000-" + "a" * 32 + ".parquet",
                "size": 1, "rows": 1, "sha256": "0" * 64, "schema": "0" * 16}]},
    {"v": 9, "checkpoint": 3, "last_epoch": 0, "files": []},
    {"v": 1, "checkpoint": "3", "last_epoch": 0, "files": []},
])
def test_handles_read_back_from_a_checkpoint_are_not_trusted(out, bad):
    with pytest.raises(CorruptCheckpointError):
        new_sink(out).recover(bad)


# -- bad input --------------------------------------------------------------------------------
def test_an_existing_table_with_other_columns_is_refused_clearly(out):
    sink = new_sink(out)
    sink.stage_epoch(0, sink.epoch_writer().write(0, 0, pa.table({"y": pa.array([1.5])})))
    sink.commit(roundtrip(sink.pre_commit(1)))
    other = new_sink(out, app_id="other-job")
    run_epoch(other, 0, (1,))
    with pytest.raises(ConfigError, match=r"output columns \(x long, s string\) differ .* \(y double\)"):
        other.commit(roundtrip(other.pre_commit(1)))


def test_a_path_that_is_almost_a_url_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="s3://bucket/prefix"):
        DeltaSink("s3:/bucket/table")
    with pytest.raises(ConfigError, match="not supported"):
        DeltaSink(f"memory://t-{uuid.uuid4().hex}")


def test_s3fs_options_are_translated_for_delta_rs():
    opts = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000",
                                                         "region_name": "eu-west-1"}, "skip_instance_cache": True}
    assert translate_storage_options("s3", opts) == {
        "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true", "AWS_REGION": "eu-west-1"}
    with pytest.raises(ConfigError, match=r"\['profile'\].*delta_storage_options"):
        translate_storage_options("s3", {"profile": "dev"})


# -- on an S3 API ----------------------------------------------------------------------------
@pytest.mark.s3
def test_commit_and_recovery_on_s3(s3_server, s3_bucket):
    url = f"s3://{s3_bucket}/table"
    opts = {**s3_server.storage_options(), "skip_instance_cache": True}
    sink = new_sink(url, storage_options=opts)
    run_epoch(sink, 0, (1, 2), (3,))
    h1 = roundtrip(sink.pre_commit(1))
    sink.commit(h1)
    run_epoch(sink, 1, (4,))
    h2 = roundtrip(sink.pre_commit(2))
    run_epoch(sink, 2, (5,))            # never checkpointed

    again = new_sink(url, storage_options=opts)
    again.recover(h2)                    # the crash hit between `_metadata` of 2 and its commit
    again.recover(h2)                    # and recovery itself crashed and re-ran
    got = read_committed(url, opts)
    assert sorted(got.column("x").to_pylist()) == [1, 2, 3, 4]
    assert again.transaction_version() == 2
    assert again.committed_epochs() == [0, 1]
    leftover = [p for p in again._storage.fs.find(again.root) if "/epoch-" in p]
    assert sorted(p.split("/table/", 1)[1] for p in leftover) == again.committed_files()
