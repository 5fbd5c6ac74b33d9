from __future__ import annotations

import json
from pathlib import Path

import pytest
from snapshot_support import Remote, local_checkpoint, open_db, put_keys, read_all

from sparkpoint.errors import CorruptSnapshotError
from sparkpoint.state.restore import restore_snapshot
from sparkpoint.state.snapshot import SnapshotHandleIndex, verify_snapshot
from sparkpoint.state.upload import upload_snapshot


def _as_stored(handle: dict) -> dict:
    """The handle as a restore reads it back from `_metadata`."""
    return json.loads(json.dumps(handle))


def test_restore_from_storage_gives_back_every_key(tmp_path: Path, remote: Remote) -> None:
    db = open_db(tmp_path / "db")
    expected = put_keys(db, range(20_000), seed=1)
    result = upload_snapshot(str(local_checkpoint(db, tmp_path / "chk-1")), remote.fs, remote.layout,
                             1, "counts/0")
    db.close()

    report = restore_snapshot(_as_stored(result.handle), remote.fs, remote.layout, str(tmp_path / "restored"))

    assert read_all(tmp_path / "restored") == expected
    assert report.from_local == set() and report.local_problems == ()
    assert report.from_remote == {f["name"] for f in result.handle["files"]}
    assert verify_snapshot(result.handle, remote.fs, remote.layout) == []


def test_valid_local_copy_is_used_without_downloading(tmp_path: Path, remote: Remote) -> None:
    db = open_db(tmp_path / "db")
    expected = put_keys(db, range(5_000), seed=1)
    chk = local_checkpoint(db, tmp_path / "chk-1")
    db.close()
    result = upload_snapshot(str(chk), remote.fs, remote.layout, 1, "counts/0")

    report = restore_snapshot(_as_stored(result.handle), remote.fs, remote.layout, str(tmp_path / "restored"),
                              local_copy_dir=str(chk))

    assert report.from_remote == set() and report.bytes_remote == 0
    assert read_all(tmp_path / "restored") == expected
    # The local recovery copy is still intact for the next failover.
    assert read_all(chk) == expected


def test_newer_checkpoint_restores_after_older_checkpoint_files_are_deleted(tmp_path: Path, remote: Remote) -> None:
    db = open_db(tmp_path / "db")
    expected = put_keys(db, range(20_000), seed=1)
    first = upload_snapshot(str(local_checkpoint(db, tmp_path / "chk-1")), remote.fs, remote.layout,
                            1, "counts/0")
    expected.update(put_keys(db, range(0, 20_000, 100), seed=2))
    second = upload_snapshot(str(local_checkpoint(db, tmp_path / "chk-2")), remote.fs, remote.layout,
                             2, "counts/0", previous=SnapshotHandleIndex.from_handles([first.handle]))
    db.close()
    assert second.metrics.files_reused >= 1  # the two checkpoints really share files

    remote.fs.rm(remote.layout.checkpoint(1), recursive=True)
    restore_snapshot(_as_stored(second.handle), remote.fs, remote.layout, str(tmp_path / "restored"))

    assert read_all(tmp_path / "restored") == expected


def test_restore_refuses_a_directory_that_holds_files(tmp_path: Path, remote: Remote) -> None:
    db = open_db(tmp_path / "db")
    put_keys(db, range(10), seed=1)
    result = upload_snapshot(str(local_checkpoint(db, tmp_path / "chk-1")), remote.fs, remote.layout,
                             1, "counts/0")
    db.close()
    with pytest.raises(FileExistsError, match="fresh directory"):
        restore_snapshot(result.handle, remote.fs, remote.layout, str(tmp_path / "db"))


@pytest.mark.parametrize("entry", [
    {"name": "../../evil", "path": "shared/x", "size": 1, "sha256": "00", "shared": True},
    {"name": "000001.sst", "path": "/etc/passwd", "size": 1, "sha256": "00", "shared": True},
    {"name": "000001.sst", "path": "shared/../../x", "size": 1, "sha256": "00", "shared": True},
    {"name": "000001.sst", "size": 1},
])
def test_handle_pointing_outside_its_directories_is_rejected(tmp_path: Path, remote: Remote, entry: dict) -> None:
    handle = {"format": "sparkpoint/rocksdb-snapshot", "version": 1, "checkpoint_id": 4,
              "participant": "counts/0", "files": [entry]}
    with pytest.raises(CorruptSnapshotError, match="checkpoint 4"):
        restore_snapshot(handle, remote.fs, remote.layout, str(tmp_path / "restored"))
    assert not (tmp_path / "restored").exists()


def test_unknown_handle_format_is_rejected(tmp_path: Path, remote: Remote) -> None:
    handle = {"format": "sparkpoint/rocksdb-snapshot", "version": 99, "checkpoint_id": 4, "files": []}
    with pytest.raises(CorruptSnapshotError, match="version 99"):
        restore_snapshot(handle, remote.fs, remote.layout, str(tmp_path / "restored"))
