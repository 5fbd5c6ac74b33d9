"""The epoch plan log's format: an entry reads back as written, and a damaged, missing or
moved one is one EpochPlanError naming the file; start-up gc deletes the entries no
retained checkpoint can need."""

from __future__ import annotations

import pytest

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.errors import EpochPlanError
from sparkpoint.storage.checkpoint_storage import FsCheckpointStorage
from sparkpoint.storage.epoch_plans import EpochPlan, EpochPlanLog
from sparkpoint.storage.gc import collect_garbage


def plan(epoch: int, history: str = "h1") -> EpochPlan:
    return EpochPlan(epoch, history, {"events:0": 20 * epoch, "events:1": 20 * epoch},
                     {"events:0": 20 * epoch + 20, "events:1": 20 * epoch + 7}, epoch == 9,
                     None if epoch == 9 else 1_700_000_000_000 + epoch, 1_700_000_000_500 + epoch)


def test_an_entry_reads_back_as_written(storage: FsCheckpointStorage) -> None:
    log = EpochPlanLog(storage.fs, storage.layout)
    for e in (3, 4, 9):
        log.write(plan(e))
    assert [log.read(e) for e in (3, 4, 9)] == [plan(3), plan(4), plan(9)]
    assert log.epochs() == [3, 4, 9]
    assert log.path(3).endswith("/plans/epoch-00000000000000000003.json")


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "not json"])
def test_a_damaged_entry_is_one_error_naming_the_file(storage: FsCheckpointStorage, damage: str) -> None:
    log = EpochPlanLog(storage.fs, storage.layout)
    log.write(plan(5))
    raw = storage.fs.read_bytes(log.path(5))
    bad = {"flipped byte": raw.replace(b'"events:1":107', b'"events:1":108'),
           "truncated": raw[: len(raw) // 2], "not json": b"\x00\x01"}[damage]
    assert bad != raw
    storage.fs.write_atomic(log.path(5), bad)
    with pytest.raises(EpochPlanError, match=r"epoch-00000000000000000005\.json"):
        log.read(5)


def test_a_missing_or_moved_entry_is_an_error(storage: FsCheckpointStorage) -> None:
    log = EpochPlanLog(storage.fs, storage.layout)
    with pytest.raises(EpochPlanError, match="is missing"):
        log.read(2)
    storage.fs.write_atomic(log.path(2), plan(3).encode())  # copied under another epoch's name
    with pytest.raises(EpochPlanError, match="records epoch 3, not 2"):
        log.read(2)


def _checkpoint_at_epoch(storage: FsCheckpointStorage, checkpoint_id: int, epoch: int) -> None:
    location = storage.initialize_location(checkpoint_id)
    storage.commit_metadata(location, CompletedCheckpointData(
        job_name=storage.job_name, checkpoint_id=checkpoint_id, trigger_timestamp_ms=1_000,
        completion_timestamp_ms=1_005, handles={"job": {"epoch": epoch}}))


def test_gc_deletes_the_plans_at_or_below_the_oldest_checkpoints_epoch(storage: FsCheckpointStorage) -> None:
    log = EpochPlanLog(storage.fs, storage.layout)
    for e in range(1, 9):
        log.write(plan(e))
    _checkpoint_at_epoch(storage, 4, 3)
    _checkpoint_at_epoch(storage, 5, 6)
    storage.fs.write_atomic(storage.layout.metadata(3), b"damaged")  # never restored: does not count

    report = collect_garbage(storage.fs, storage.layout, grace_period_s=0)

    assert report.deleted_epoch_plans == [1, 2, 3]
    assert log.epochs() == [4, 5, 6, 7, 8]  # a restore of the checkpoint at epoch 3 reads 4..
