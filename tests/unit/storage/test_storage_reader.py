"""One reader of `_metadata` (`metadata.read_completed`) and one check of a stored file
(`inspect.check_file`), shared by restore, discard, gc, `checkpoints list|verify` and
`doctor`: they cannot disagree about what a checkpoint is."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest
from storage_support import ManualClock, complete_checkpoint, put

from sparkpoint.errors import CorruptCheckpointError, ForeignCheckpointError
from sparkpoint.ops.inspect_cli import doctor_report, list_report, verify_report
from sparkpoint.storage import metadata
from sparkpoint.storage.checkpoint_storage import FsCheckpointStorage
from sparkpoint.storage.gc import collect_garbage
from sparkpoint.storage.handles import FileEntry
from sparkpoint.storage.inspect import check_file, doctor, list_checkpoints, verify_checkpoints


# -- the reader ------------------------------------------------------------------------
def test_read_completed_returns_the_checkpoint_or_none(storage: FsCheckpointStorage) -> None:
    data = complete_checkpoint(storage, 1, {"shared/a.sst": b"a"})
    storage.initialize_location(2)
    assert metadata.read_completed(storage.fs, storage.layout, 1) == data
    assert metadata.read_completed(storage.fs, storage.layout, 2) is None  # never completed
    assert metadata.read_completed(storage.fs, storage.layout, 3) is None  # no directory at all


def test_read_completed_treats_a_file_discarded_after_listing_as_absent(
        storage: FsCheckpointStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    complete_checkpoint(storage, 1, {"shared/a.sst": b"a"})

    def vanished(path: str) -> bytes:
        raise FileNotFoundError(path)

    monkeypatch.setattr(storage.fs, "read_bytes", vanished)
    assert metadata.read_completed(storage.fs, storage.layout, 1) is None


def test_read_completed_refuses_damaged_foreign_and_misplaced_metadata(storage: FsCheckpointStorage) -> None:
    fs, layout = storage.fs, storage.layout
    complete_checkpoint(storage, 1, {"shared/a.sst": b"a"})
    raw = fs.read_bytes(layout.metadata(1))
    for checkpoint_id, content, error in [
            (2, raw[:-20], CorruptCheckpointError),                      # torn write
            (3, b'{"format": "something-else"}', ForeignCheckpointError),  # not ours
            (4, raw, CorruptCheckpointError)]:                           # chk-1's, copied into chk-4
        storage.initialize_location(checkpoint_id)
        fs.write_atomic(layout.metadata(checkpoint_id), content)
        with pytest.raises(error, match=f"chk-{checkpoint_id}/_metadata"):
            metadata.read_completed(fs, layout, checkpoint_id)
    with pytest.raises(CorruptCheckpointError, match="records checkpoint 1, not 4"):
        metadata.read_completed(fs, layout, 4)


# -- every caller goes through it ------------------------------------------------------
@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts `read_completed` calls per checkpoint id, and fails any decode of
    `_metadata` done outside it."""
    counted: Counter = Counter()
    original_read, original_decode = metadata.read_completed, metadata.decode
    inside = [0]

    def read_completed(fs, layout, checkpoint_id):
        counted[checkpoint_id] += 1
        inside[0] += 1
        try:
            return original_read(fs, layout, checkpoint_id)
        finally:
            inside[0] -= 1

    def decode(raw, expected_job=None, source="checkpoint metadata"):
        assert inside[0], f"{source} decoded outside metadata.read_completed"
        return original_decode(raw, expected_job, source)

    monkeypatch.setattr(metadata, "read_completed", read_completed)
    monkeypatch.setattr(metadata, "decode", decode)
    return counted


def test_restore_discard_gc_list_verify_and_doctor_all_use_the_one_reader(
        storage: FsCheckpointStorage, clock: ManualClock, tmp_path: Path, reads: Counter) -> None:
    complete_checkpoint(storage, 1, {"shared/a.sst": b"a"})
    complete_checkpoint(storage, 2, {"shared/b.sst": b"b"})
    fs, layout = storage.fs, storage.layout
    callers = {
        "load_completed": lambda: storage.load_completed(),
        "gc": lambda: collect_garbage(fs, layout, clock=clock, dry_run=True),
        "list": lambda: list_checkpoints(fs, layout),
        "verify": lambda: verify_checkpoints(fs, layout),
        "doctor": lambda: doctor(fs, layout, clock=clock),
        "cli list": lambda: list_report(str(tmp_path)),
        "cli verify": lambda: verify_report(str(tmp_path)),
        "cli doctor": lambda: doctor_report(str(tmp_path)),
    }
    for name, call in callers.items():
        reads.clear()
        call()
        assert set(reads) == {1, 2}, f"{name} read {dict(reads)}"

    reads.clear()
    storage.discard_completed(1, still_referenced=[])
    assert reads == Counter({1: 1})
    assert not fs.exists(layout.join("shared/a.sst")) and fs.exists(layout.join("shared/b.sst"))


# -- a `_metadata` recording another checkpoint id -------------------------------------
def test_misplaced_metadata_is_skipped_by_restore_and_reported_alike_by_every_tool(
        storage: FsCheckpointStorage, clock: ManualClock, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    fs, layout = storage.fs, storage.layout
    first = complete_checkpoint(storage, 1, {"shared/a.sst": b"a"})
    storage.initialize_location(2)
    fs.write_atomic(layout.metadata(2), fs.read_bytes(layout.metadata(1)))  # copied by hand
    fs.write_atomic(layout.join("shared/orphan.sst"), b"o")
    clock.advance(7_200)
    problem = f"{layout.metadata(2)} records checkpoint 1, not 2"

    with caplog.at_level(logging.WARNING):
        assert storage.load_completed() == [first]
    assert f"skipping chk-2: {problem}" in caplog.text

    [ok, bad] = verify_checkpoints(fs, layout)
    assert ok.ok and not bad.ok and bad.completed and bad.problems[0].startswith(problem)
    [_, row] = list_checkpoints(fs, layout)
    assert not row.completed and row.problem == bad.problems[0]
    findings = {f.code: f for f in doctor(fs, layout, clock=clock).findings}
    assert findings["corrupt-metadata"].message == f"chk-2: {bad.problems[0]}"
    assert findings["restore-point"].message == "the job restores from chk-1"

    cli = verify_report(str(tmp_path)).to_dict()["jobs"][0]["checkpoints"][1]
    assert cli == {"checkpoint_id": 2, "completed": True, "ok": False, "files_checked": 0,
                   "problems": bad.problems}

    # gc cannot tell what chk-2 references: it deletes no shared file
    report = collect_garbage(fs, layout, clock=clock)
    assert report.deleted_shared_files == [] and problem in (report.shared_files_skipped_reason or "")
    assert fs.exists(layout.join("shared/orphan.sst"))


# -- the one file check ----------------------------------------------------------------
def test_check_file_size_then_sha256_and_never_outside_the_job(storage: FsCheckpointStorage) -> None:
    fs, layout = storage.fs, storage.layout
    entry = FileEntry.from_json(put(fs, layout, "shared/a.sst", b"abcd"))
    assert check_file(fs, layout, entry) is None
    fs.write_atomic(layout.join("shared/a.sst"), b"abcX")
    assert check_file(fs, layout, entry) == "shared/a.sst fails its sha256 check (damaged or overwritten)"
    assert check_file(fs, layout, entry, hash_files=False) is None
    fs.write_atomic(layout.join("shared/a.sst"), b"abc")
    assert check_file(fs, layout, entry, hash_files=False) == "shared/a.sst has 3 bytes, the checkpoint recorded 4"
    fs.rm(layout.join("shared/a.sst"))
    assert check_file(fs, layout, entry) == "shared/a.sst is missing"

    fs.write_atomic(f"{fs.root}/secret", b"abcd")
    escaping = FileEntry("shared/../../secret", 4, entry.sha256, True, "secret")
    assert "not a plain path relative to the job directory" in (check_file(fs, layout, escaping) or "")
