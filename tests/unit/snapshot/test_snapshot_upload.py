from __future__ import annotations

import json
from pathlib import Path

from snapshot_support import Remote, local_checkpoint, open_db, put_keys

from sparkpoint.state.snapshot import SnapshotHandleIndex, referenced_files
from sparkpoint.state.upload import FileHashCache, upload_snapshot

N_KEYS = 20_000


def test_incremental_checkpoint_uploads_only_new_files(tmp_path: Path, remote: Remote) -> None:
    db = open_db(tmp_path / "db")
    put_keys(db, range(N_KEYS), seed=1)
    first = upload_snapshot(str(local_checkpoint(db, tmp_path / "chk-1")), remote.fs, remote.layout,
                            1, "counts/0")
    put_keys(db, range(0, N_KEYS, 100), seed=2)  # 1% of the keys change
    second = upload_snapshot(str(local_checkpoint(db, tmp_path / "chk-2")), remote.fs, remote.layout,
                             2, "counts/0", previous=SnapshotHandleIndex.from_handles([first.handle]))
    db.close()

    first_ssts = {f["name"] for f in first.handle["files"] if f["name"].endswith(".sst")}
    assert first.metrics.files_reused == 0
    assert second.metrics.bytes_uploaded * 20 < first.metrics.bytes_uploaded
    assert first_ssts <= set(second.reused)
    assert second.metrics.bytes_reused >= sum(
        f["size"] for f in first.handle["files"] if f["name"] in first_ssts)
    # Unchanged SSTs are the very same stored objects, not copies.
    assert referenced_files(first.handle) & referenced_files(second.handle) == {
        f["path"] for f in first.handle["files"] if f["shared"]}


def test_reuse_is_found_in_storage_without_previous_handles(tmp_path: Path, remote: Remote) -> None:
    # After a restart the runtime may not have the previous handles at hand.
    db = open_db(tmp_path / "db")
    put_keys(db, range(N_KEYS), seed=1)
    upload_snapshot(str(local_checkpoint(db, tmp_path / "chk-1")), remote.fs, remote.layout, 1, "counts/0")
    put_keys(db, range(10), seed=2)
    second = upload_snapshot(str(local_checkpoint(db, tmp_path / "chk-2")), remote.fs, remote.layout,
                             2, "counts/0")
    db.close()
    assert second.metrics.files_reused >= 1
    assert second.metrics.bytes_reused > second.metrics.bytes_uploaded


def test_truncated_shared_file_left_by_a_crashed_upload_is_uploaded_again(tmp_path: Path, remote: Remote) -> None:
    db = open_db(tmp_path / "db")
    put_keys(db, range(N_KEYS), seed=1)
    chk = local_checkpoint(db, tmp_path / "chk-1")
    db.close()
    first = upload_snapshot(str(chk), remote.fs, remote.layout, 1, "counts/0")
    sst = next(f for f in first.handle["files"] if f["shared"])
    stored = remote.local_path(sst["path"])
    stored.write_bytes(stored.read_bytes()[:100])

    again = upload_snapshot(str(chk), remote.fs, remote.layout, 2, "counts/0")

    assert sst["name"] not in again.reused
    assert stored.stat().st_size == sst["size"]


def test_unchanged_ssts_are_hashed_once(tmp_path: Path, remote: Remote) -> None:
    cache = FileHashCache()
    db = open_db(tmp_path / "db")
    put_keys(db, range(N_KEYS), seed=1)
    upload_snapshot(str(local_checkpoint(db, tmp_path / "chk-1")), remote.fs, remote.layout, 1, "counts/0",
                    hash_cache=cache)
    hashed_after_first = cache.misses
    put_keys(db, range(10), seed=2)
    second = upload_snapshot(str(local_checkpoint(db, tmp_path / "chk-2")), remote.fs, remote.layout,
                             2, "counts/0", hash_cache=cache)
    db.close()
    new_ssts = second.metrics.files_uploaded - sum(1 for f in second.handle["files"] if not f["shared"])
    assert cache.misses == hashed_after_first + new_ssts
    assert cache.hits >= second.metrics.files_reused >= 1


def test_handle_is_plain_json_with_every_file(tmp_path: Path, remote: Remote) -> None:
    db = open_db(tmp_path / "db")
    put_keys(db, range(100), seed=1)
    chk = local_checkpoint(db, tmp_path / "chk-3")
    db.close()
    result = upload_snapshot(str(chk), remote.fs, remote.layout, 3, "counts/0")

    handle = json.loads(json.dumps(result.handle))
    assert {f["name"] for f in handle["files"]} == {p.name for p in chk.iterdir()}
    assert referenced_files(handle) == remote.all_files()
    for f in handle["files"]:
        expected_dir = "shared/counts/0/" if f["name"].endswith(".sst") else "chk-3/counts/0/"
        assert f["path"].startswith(expected_dir) and f["shared"] == f["name"].endswith(".sst")


def test_local_checkpoint_is_kept_unless_asked(tmp_path: Path, remote: Remote) -> None:
    db = open_db(tmp_path / "db")
    put_keys(db, range(100), seed=1)
    kept = local_checkpoint(db, tmp_path / "chk-1")
    dropped = local_checkpoint(db, tmp_path / "chk-2")
    db.close()
    upload_snapshot(str(kept), remote.fs, remote.layout, 1, "counts/0")
    upload_snapshot(str(dropped), remote.fs, remote.layout, 2, "counts/0", retain_local=False)
    assert kept.is_dir() and not dropped.exists()
