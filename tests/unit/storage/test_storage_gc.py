"""Startup gc removes only stale leftovers of crashed runs; never what a completed
checkpoint references, never what may still be being written."""

from __future__ import annotations

import os
import time

import pytest
from storage_support import ManualClock, complete_checkpoint, put

from sparkpoint.errors import LeaseLostError
from sparkpoint.storage.checkpoint_storage import FsCheckpointStorage
from sparkpoint.storage.gc import collect_garbage
from sparkpoint.storage.lease import JobLease

HOUR = 3600.0


def age(storage: FsCheckpointStorage, rel: str, seconds: float) -> None:
    """Make every file at/below `rel` look `seconds` old."""
    for f in storage.fs.find(storage.layout.join(rel)) or [storage.fs.stat(storage.layout.join(rel))]:
        t = time.time() - seconds
        os.utime(f.path, (t, t))


@pytest.fixture
def now() -> ManualClock:
    return ManualClock(time.time())


def crashed_run_leftovers(storage: FsCheckpointStorage) -> None:
    """chk-1 completed (uses a.sst); chk-2 never completed; an orphan shared file; a temp file."""
    complete_checkpoint(storage, 1, {"shared/a.sst": b"a", "chk-{id}/MANIFEST": b"m"})
    storage.initialize_location(2)
    put(storage.fs, storage.layout, "chk-2/state/b.sst", b"bb")
    put(storage.fs, storage.layout, "shared/orphan.sst", b"ooo")
    put(storage.fs, storage.layout, "shared/c.sst.tmp-0123abcd", b"t")


def test_stale_leftovers_are_deleted_and_reported(storage: FsCheckpointStorage, now: ManualClock) -> None:
    crashed_run_leftovers(storage)
    marker_bytes = storage.fs.size(storage.layout.started(2))
    age(storage, "", 2 * HOUR)

    report = collect_garbage(storage.fs, storage.layout, grace_period_s=HOUR, clock=now)

    assert report.deleted_checkpoints == [2]
    assert report.deleted_shared_files == ["shared/c.sst.tmp-0123abcd", "shared/orphan.sst"]
    assert report.freed_bytes == marker_bytes + len(b"bb") + len(b"ooo") + len(b"t")
    assert [c.checkpoint_id for c in storage.load_completed()] == [1]
    assert storage.fs.read_bytes(storage.layout.join("shared/a.sst")) == b"a"
    assert storage.fs.exists(storage.layout.join("chk-1/MANIFEST"))


def test_young_leftovers_are_kept(storage: FsCheckpointStorage, now: ManualClock) -> None:
    crashed_run_leftovers(storage)
    age(storage, "", 2 * HOUR)
    age(storage, "chk-2/state/b.sst", 60)  # still being written by someone
    age(storage, "shared/orphan.sst", 60)

    report = collect_garbage(storage.fs, storage.layout, grace_period_s=HOUR, clock=now)

    assert report.deleted_checkpoints == [] and "shared/orphan.sst" not in report.deleted_shared_files
    assert storage.fs.exists(storage.layout.join("chk-2/state/b.sst"))
    assert storage.fs.exists(storage.layout.join("shared/orphan.sst"))


def test_in_flight_checkpoints_are_kept_however_old(storage: FsCheckpointStorage, now: ManualClock) -> None:
    crashed_run_leftovers(storage)
    age(storage, "", 2 * HOUR)
    report = collect_garbage(storage.fs, storage.layout, grace_period_s=HOUR, in_flight=[2], clock=now)
    assert report.deleted_checkpoints == [] and "chk-2: in flight" in report.kept


def test_unreadable_metadata_protects_all_shared_files(storage: FsCheckpointStorage, now: ManualClock) -> None:
    crashed_run_leftovers(storage)
    meta = storage.layout.metadata(1)
    storage.fs.write_atomic(meta, storage.fs.read_bytes(meta)[:30])
    age(storage, "", 2 * HOUR)

    report = collect_garbage(storage.fs, storage.layout, grace_period_s=HOUR, clock=now)

    assert report.deleted_shared_files == []
    assert "chk-1/_metadata is unreadable" in report.shared_files_skipped_reason
    assert storage.fs.exists(storage.layout.join("shared/a.sst"))


def test_dry_run_deletes_nothing(storage: FsCheckpointStorage, now: ManualClock) -> None:
    crashed_run_leftovers(storage)
    age(storage, "", 2 * HOUR)
    before = [f.path for f in storage.fs.find(storage.layout.root)]
    report = collect_garbage(storage.fs, storage.layout, grace_period_s=HOUR, clock=now, dry_run=True)
    assert report.deleted_checkpoints == [2] and report.dry_run
    assert [f.path for f in storage.fs.find(storage.layout.root)] == before


def test_gc_refuses_to_run_for_a_fenced_run(storage: FsCheckpointStorage, now: ManualClock) -> None:
    old = JobLease(storage.fs, storage.layout, "old", ttl_s=30, clock=ManualClock(now.now))
    old.acquire()
    crashed_run_leftovers(storage)
    age(storage, "", 2 * HOUR)
    now.advance(31)
    JobLease(storage.fs, storage.layout, "new", ttl_s=30, clock=now).acquire()
    with pytest.raises(LeaseLostError):
        collect_garbage(storage.fs, storage.layout, grace_period_s=HOUR, lease=old, clock=now)
    assert storage.fs.exists(storage.layout.checkpoint(2))
