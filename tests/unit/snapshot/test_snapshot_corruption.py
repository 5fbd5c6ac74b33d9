"""Damaged RocksDB files, in the local recovery copy and in checkpoint storage (seed 003)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
from snapshot_support import (
    Remote,
    bad_magic,
    flipped_data_block,
    largest_sst,
    local_checkpoint,
    missing,
    open_db,
    put_keys,
    read_all,
    truncated,
)

from sparkpoint.errors import CorruptSnapshotError
from sparkpoint.state.restore import restore_snapshot
from sparkpoint.state.snapshot import ProblemKind, verify_snapshot
from sparkpoint.state.upload import upload_snapshot

DAMAGE: dict[str, tuple[Callable[[Path], None], ProblemKind]] = {
    "bad magic number": (bad_magic, ProblemKind.CHECKSUM_MISMATCH),
    "flipped bytes in a data block": (flipped_data_block, ProblemKind.CHECKSUM_MISMATCH),
    "truncated": (truncated, ProblemKind.SIZE_MISMATCH),
    "missing": (missing, ProblemKind.MISSING),
}


class Snapshot:
    """One uploaded checkpoint (two SSTs) with its local recovery copy, private to a test."""

    def __init__(self, root: Path, handle: dict, expected: dict[bytes, bytes]):
        self.local_copy = root / "local" / "chk-1"
        self.remote = Remote.at(root / "remote")
        self.handle = handle
        self.expected = expected
        self.target = root / "restored"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    root = tmp_path_factory.mktemp("pristine")
    remote = Remote.at(root / "remote")
    db = open_db(root / "db")
    expected = put_keys(db, range(10_000), seed=1)
    db.flush()
    expected.update(put_keys(db, range(10_000, 20_000), seed=2))
    chk = local_checkpoint(db, root / "local" / "chk-1")
    db.close()
    handle = json.loads(json.dumps(upload_snapshot(str(chk), remote.fs, remote.layout, 1, "counts/0").handle))
    assert sum(f["name"].endswith(".sst") for f in handle["files"]) == 2
    return Snapshot(root, handle, expected)


@pytest.fixture
def snapshot(pristine: Snapshot, tmp_path: Path) -> Snapshot:
    shutil.copytree(pristine.local_copy, tmp_path / "local" / "chk-1")
    shutil.copytree(pristine.remote.fs.root, tmp_path / "remote")
    return Snapshot(tmp_path, pristine.handle, pristine.expected)


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_local_file_is_fetched_from_storage(snapshot: Snapshot, damage: str) -> None:
    corrupt, kind = DAMAGE[damage]
    sst = largest_sst(snapshot.handle)["name"]
    corrupt(snapshot.local_copy / sst)

    report = restore_snapshot(snapshot.handle, snapshot.remote.fs, snapshot.remote.layout,
                              str(snapshot.target), local_copy_dir=str(snapshot.local_copy))

    assert read_all(snapshot.target) == snapshot.expected
    assert report.from_remote == {sst}
    assert report.from_local == {f["name"] for f in snapshot.handle["files"]} - {sst}
    assert [(p.file.name, p.kind) for p in report.local_problems] == [(sst, kind)]
    assert report.corrupt_local == ({sst} if kind is not ProblemKind.MISSING else set())


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_stored_file_fails_restore_naming_it(snapshot: Snapshot, damage: str) -> None:
    corrupt, kind = DAMAGE[damage]
    sst = largest_sst(snapshot.handle)
    corrupt(snapshot.remote.local_path(sst["path"]))

    with pytest.raises(CorruptSnapshotError) as raised:
        restore_snapshot(snapshot.handle, snapshot.remote.fs, snapshot.remote.layout, str(snapshot.target))

    assert sst["name"] in str(raised.value) and "checkpoint 1" in str(raised.value)
    assert [(p.file.name, p.kind) for p in raised.value.problems] == [(sst["name"], kind)]
    assert not snapshot.target.exists()
    assert [p.name for p in snapshot.target.parent.iterdir() if p.name.startswith("restored")] == []
    problems = verify_snapshot(snapshot.handle, snapshot.remote.fs, snapshot.remote.layout)
    assert [(p.file.name, p.kind) for p in problems] == [(sst["name"], kind)]


def test_damaged_stored_file_is_not_needed_when_the_local_copy_is_valid(snapshot: Snapshot) -> None:
    bad_magic(snapshot.remote.local_path(largest_sst(snapshot.handle)["path"]))

    report = restore_snapshot(snapshot.handle, snapshot.remote.fs, snapshot.remote.layout,
                              str(snapshot.target), local_copy_dir=str(snapshot.local_copy))

    assert report.from_remote == set()
    assert read_all(snapshot.target) == snapshot.expected


def test_damage_in_both_copies_fails_restore(snapshot: Snapshot) -> None:
    sst = largest_sst(snapshot.handle)
    flipped_data_block(snapshot.local_copy / sst["name"])
    truncated(snapshot.remote.local_path(sst["path"]))

    with pytest.raises(CorruptSnapshotError, match=sst["name"]):
        restore_snapshot(snapshot.handle, snapshot.remote.fs, snapshot.remote.layout,
                         str(snapshot.target), local_copy_dir=str(snapshot.local_copy))
    assert not snapshot.target.exists()
