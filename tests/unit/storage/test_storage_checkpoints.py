"""FsCheckpointStorage on local disk: corrupt metadata skipped, retention never deletes
outside the job, jobs isolated. What every storage backend must do (stage, commit,
re-commit, discard) is in tests/contracts/test_checkpoint_storage_contract.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from storage_support import ManualClock, complete_checkpoint, local_job

from sparkpoint.errors import ConfigError
from sparkpoint.storage.checkpoint_storage import FsCheckpointStorage, open_job_storage

SST_A, SST_B, SST_C = "shared/state/counts/0/a-000001.sst", "shared/state/counts/0/b-000002.sst", \
    "shared/state/counts/0/c-000003.sst"


def test_corrupt_and_foreign_metadata_are_skipped_with_a_log_line(
        storage: FsCheckpointStorage, caplog: pytest.LogCaptureFixture) -> None:
    complete_checkpoint(storage, 1, {SST_A: b"a"})
    complete_checkpoint(storage, 2, {SST_B: b"b"})
    meta = storage.layout.metadata(2)
    storage.fs.write_atomic(meta, storage.fs.read_bytes(meta)[:-40])
    storage.initialize_location(3)
    storage.fs.write_atomic(storage.layout.metadata(3), b'{"format": "flink"}')
    with caplog.at_level(logging.WARNING):
        assert [c.checkpoint_id for c in storage.load_completed()] == [1]
    assert "skipping chk-2" in caplog.text and "skipping chk-3" in caplog.text


def test_discard_completed_never_touches_paths_outside_shared(storage: FsCheckpointStorage,
                                                              tmp_path: Path) -> None:
    other = FsCheckpointStorage(*local_job(tmp_path, "other-job"))
    complete_checkpoint(other, 1, {SST_A: b"other"})
    data = complete_checkpoint(storage, 1, {SST_A: b"a"})
    # A hand-edited handle pointing outside the job must not make us delete anything there.
    hostile = {"files": [{"path": "shared/../../other-job/" + SST_A, "size": 5, "sha256": "", "shared": True}]}
    storage.fs.rm(storage.layout.metadata(1))
    storage.commit_metadata(type("L", (), {"checkpoint_id": 1})(),
                            type(data)(data.job_name, 1, 0, 0, {"state:x": hostile}))
    storage.discard_completed(1, still_referenced=[])
    assert other.fs.read_bytes(other.layout.join(SST_A)) == b"other"


def test_jobs_under_one_root_never_touch_each_others_files(tmp_path: Path) -> None:
    orders = FsCheckpointStorage(*local_job(tmp_path, "orders"))
    payments = FsCheckpointStorage(*local_job(tmp_path, "payments"))
    complete_checkpoint(orders, 1, {SST_A: b"orders-a"})
    paid = complete_checkpoint(payments, 1, {SST_A: b"payments-a"})

    orders.discard_completed(1, still_referenced=[])
    orders.discard_location(2)

    assert orders.load_completed() == []
    assert payments.load_completed() == [paid]
    assert payments.fs.read_bytes(payments.layout.join(SST_A)) == b"payments-a"


def test_open_job_storage_builds_collaborators_without_writing(tmp_path: Path) -> None:
    js = open_job_storage(str(tmp_path), "orders", run_id="run-1", clock=ManualClock())
    fs, layout, *_ = js
    assert layout.root == f"{tmp_path}/orders" and js.checkpoints.layout == layout
    assert not fs.exists(layout.root)
    with pytest.raises(ConfigError, match="job name '../x' is invalid"):
        open_job_storage(str(tmp_path), "../x")
