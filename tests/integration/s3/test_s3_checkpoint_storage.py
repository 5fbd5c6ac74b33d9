"""Checkpoint storage on an S3 API (moto server on 127.0.0.1): gc by object ages and
opening a job's storage. Conditional writes, checkpoints, ids and the lease are checked
on S3 as on every backend by tests/contracts/test_checkpoint_storage_contract.py."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "unit" / "storage"))
from storage_support import complete_checkpoint, put  # noqa: E402

from sparkpoint.storage.checkpoint_storage import (  # noqa: E402
    FsCheckpointStorage,
    open_job_storage,
)
from sparkpoint.storage.gc import collect_garbage  # noqa: E402

pytestmark = pytest.mark.s3


def test_gc_uses_object_ages(s3_job) -> None:
    fs, layout = s3_job()
    storage = FsCheckpointStorage(fs, layout)
    complete_checkpoint(storage, 1, {"shared/a.sst": b"a"})
    storage.initialize_location(2)
    put(fs, layout, "chk-2/state/b.sst", b"b")
    put(fs, layout, "shared/orphan.sst", b"o")

    young = collect_garbage(fs, layout, grace_period_s=3600, clock=time.time)
    old = collect_garbage(fs, layout, grace_period_s=3600, clock=lambda: time.time() + 7200)

    assert young.deleted_checkpoints == [] and young.deleted_shared_files == []
    assert old.deleted_checkpoints == [2] and old.deleted_shared_files == ["shared/orphan.sst"]
    assert [c.checkpoint_id for c in storage.load_completed()] == [1]


def test_open_job_storage_on_s3(s3_bucket, s3_options) -> None:
    js = open_job_storage(f"s3://{s3_bucket}", "opened", s3_options, run_id="r1")
    js.lease.acquire()
    js.ids.start()
    checkpoint_id = js.ids.get_and_increment()
    complete_checkpoint(js.checkpoints, checkpoint_id, {"shared/x": b"x"})
    js.close()
    again = open_job_storage(f"s3://{s3_bucket}", "opened", s3_options, run_id="r2")
    assert again.lease.acquire().token == 2  # released cleanly: no wait
    assert [c.checkpoint_id for c in again.checkpoints.load_completed()] == [1]
