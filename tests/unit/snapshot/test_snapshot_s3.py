"""The same upload / restore / verification against an S3 API (moto on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from snapshot_support import local_checkpoint, open_db, put_keys, read_all

from sparkpoint.errors import CorruptSnapshotError
from sparkpoint.state.restore import restore_snapshot
from sparkpoint.state.snapshot import ProblemKind, SnapshotHandleIndex, verify_snapshot
from sparkpoint.state.upload import upload_snapshot
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout

pytestmark = pytest.mark.s3


@pytest.fixture
def s3(s3_server, s3_bucket: str) -> tuple[StorageFS, JobLayout]:
    fs = StorageFS.from_url(f"s3://{s3_bucket}",
                            storage_options={**s3_server.storage_options(), "skip_instance_cache": True})
    return fs, JobLayout(f"{fs.root}/job")


def test_incremental_upload_and_restore_on_s3(tmp_path: Path, s3: tuple[StorageFS, JobLayout]) -> None:
    fs, layout = s3
    db = open_db(tmp_path / "db")
    expected = put_keys(db, range(20_000), seed=1)
    first = upload_snapshot(str(local_checkpoint(db, tmp_path / "chk-1")), fs, layout, 1, "counts/0")
    expected.update(put_keys(db, range(0, 20_000, 100), seed=2))
    second = upload_snapshot(str(local_checkpoint(db, tmp_path / "chk-2")), fs, layout, 2, "counts/0",
                             previous=SnapshotHandleIndex.from_handles([first.handle]))
    db.close()
    fs.rm(layout.checkpoint(1), recursive=True)

    restore_snapshot(second.handle, fs, layout, str(tmp_path / "restored"))

    assert second.metrics.bytes_uploaded * 20 < first.metrics.bytes_uploaded
    assert read_all(tmp_path / "restored") == expected
    assert verify_snapshot(second.handle, fs, layout) == []


def test_damaged_and_missing_objects_are_named(tmp_path: Path, s3: tuple[StorageFS, JobLayout]) -> None:
    fs, layout = s3
    db = open_db(tmp_path / "db")
    put_keys(db, range(20_000), seed=1)
    handle = upload_snapshot(str(local_checkpoint(db, tmp_path / "chk-1")), fs, layout, 1, "counts/0").handle
    db.close()
    sst = next(f for f in handle["files"] if f["name"].endswith(".sst"))
    manifest = next(f for f in handle["files"] if f["name"].startswith("MANIFEST-"))
    damaged = bytearray(fs.read_bytes(layout.join(sst["path"])))
    damaged[-8:] = bytes(8)  # bad table magic number
    fs.write_atomic(layout.join(sst["path"]), bytes(damaged))
    fs.rm(layout.join(manifest["path"]))

    with pytest.raises(CorruptSnapshotError) as raised:
        restore_snapshot(handle, fs, layout, str(tmp_path / "restored"))

    found = {(p.file.name, p.kind) for p in verify_snapshot(handle, fs, layout)}
    assert found == {(sst["name"], ProblemKind.CHECKSUM_MISMATCH), (manifest["name"], ProblemKind.MISSING)}
    assert {(p.file.name, p.kind) for p in raised.value.problems} == found
    assert not (tmp_path / "restored").exists()
