"""`checkpoints list/verify` and `doctor`: what an operator sees about a job directory."""

from __future__ import annotations

import json

from storage_support import ManualClock, complete_checkpoint

from sparkpoint.storage.checkpoint_storage import FsCheckpointStorage
from sparkpoint.storage.ids import DurableCheckpointIDCounter
from sparkpoint.storage.inspect import Severity, doctor, list_checkpoints, verify_checkpoints
from sparkpoint.storage.lease import JobLease


def codes(report) -> dict[str, Severity]:
    return {f.code: f.severity for f in report.findings}


def test_list_shows_completed_and_unfinished(storage: FsCheckpointStorage) -> None:
    complete_checkpoint(storage, 1, {"shared/a.sst": b"aaaa", "chk-{id}/MANIFEST": b"mm"}, ts_ms=5_000)
    storage.initialize_location(2)
    rows = [r.to_dict() for r in list_checkpoints(storage.fs, storage.layout)]
    assert rows[0] == {"checkpoint_id": 1, "completed": True, "trigger_timestamp_ms": 5_000,
                       "completion_timestamp_ms": 5_005, "size_bytes": 6, "file_count": 2, "problem": None}
    assert rows[1]["checkpoint_id"] == 2 and rows[1]["completed"] is False and rows[1]["file_count"] == 1


def test_verify_finds_missing_resized_and_damaged_files(storage: FsCheckpointStorage) -> None:
    complete_checkpoint(storage, 1, {"shared/a.sst": b"aaaa", "shared/b.sst": b"bbbb",
                                     "shared/c.sst": b"cccc", "chk-{id}/MANIFEST": b"m"})
    fs, layout = storage.fs, storage.layout
    fs.rm(layout.join("shared/a.sst"))
    fs.write_atomic(layout.join("shared/b.sst"), b"bb")
    fs.write_atomic(layout.join("shared/c.sst"), b"cccX")

    [result] = verify_checkpoints(fs, layout)

    assert not result.ok and result.files_checked == 4
    assert result.problems == ["state:counts/0: shared/a.sst is missing",
                               "state:counts/0: shared/b.sst has 2 bytes, the checkpoint recorded 4",
                               "state:counts/0: shared/c.sst fails its sha256 check (damaged or overwritten)"]
    assert verify_checkpoints(fs, layout, hash_files=False)[0].problems[2:] == []


def test_doctor_on_a_healthy_job(storage: FsCheckpointStorage, clock: ManualClock) -> None:
    JobLease(storage.fs, storage.layout, "run-1", host="h1", pid=7, clock=clock).acquire()
    ids = DurableCheckpointIDCounter(storage.fs, storage.layout)
    complete_checkpoint(storage, ids.get_and_increment(), {"shared/a.sst": b"a"})

    report = doctor(storage.fs, storage.layout, clock=clock, hash_files=True)

    assert report.healthy
    assert codes(report) == {"lease-held": Severity.INFO, "restore-point": Severity.INFO}
    assert json.loads(json.dumps(report.to_dict()))["lease"]["run_id"] == "run-1"


def test_doctor_after_a_crash_and_a_second_writer(storage: FsCheckpointStorage, clock: ManualClock) -> None:
    JobLease(storage.fs, storage.layout, "crashed", clock=clock).acquire()
    ids = DurableCheckpointIDCounter(storage.fs, storage.layout)
    complete_checkpoint(storage, ids.get_and_increment(), {"shared/a.sst": b"a"})
    complete_checkpoint(storage, 2, {"shared/b.sst": b"b"})  # written by someone not using our _ids
    meta = storage.layout.metadata(2)
    storage.fs.write_atomic(meta, storage.fs.read_bytes(meta)[:-20])
    storage.initialize_location(3)
    storage.fs.write_atomic(storage.layout.join("shared/orphan.sst"), b"o")
    clock.advance(120)

    report = doctor(storage.fs, storage.layout, clock=clock)
    found = codes(report)

    assert not report.healthy
    assert found["lease-expired"] is Severity.WARNING
    assert found["corrupt-metadata"] is Severity.ERROR
    assert found["id-collision-risk"] is Severity.WARNING
    assert found["orphan-checkpoint-dirs"] is Severity.INFO
    assert "orphan-shared-files" not in found  # chk-2's references are unknown: no orphan claims
    assert all(f.what_to_do for f in report.findings)
    restore = next(f for f in report.findings if f.code == "restore-point")
    assert "chk-1" in restore.message


def test_doctor_names_a_broken_latest_checkpoint_and_the_fallback(storage: FsCheckpointStorage,
                                                                  clock: ManualClock) -> None:
    complete_checkpoint(storage, 1, {"shared/a.sst": b"a"})
    complete_checkpoint(storage, 2, {"shared/b.sst": b"b"})
    storage.fs.rm(storage.layout.join("shared/b.sst"))
    report = doctor(storage.fs, storage.layout, clock=clock)
    broken = next(f for f in report.findings if f.code == "checkpoint-invalid")
    assert broken.severity is Severity.ERROR and "shared/b.sst is missing" in broken.message
    assert "chk-1" in broken.what_to_do


# -- handles of other participants that use a "files" key (defect 10) -----------------
def _file_source_checkpoint(storage: FsCheckpointStorage, checkpoint_id: int, positions: dict):
    from storage_support import put

    from sparkpoint.checkpoint.interfaces import CompletedCheckpointData

    location = storage.initialize_location(checkpoint_id)
    entry = put(storage.fs, storage.layout, f"shared/state/{checkpoint_id}.sst", b"state")
    data = CompletedCheckpointData(
        job_name=storage.job_name, checkpoint_id=checkpoint_id, trigger_timestamp_ms=1_000,
        completion_timestamp_ms=1_005,
        handles={"job": {"epoch": 3}, "source:files": {"positions": positions},
                 "state:counts/0": {"kind": "rocksdb", "files": [entry]},
                 # a sink's own staged files (relative to its output, not the job): not ours
                 "sink:out": {"files": [{"path": "_staging/epoch=3/part-0.parquet", "size": 9,
                                         "sha256": "0" * 64}]}})
    storage.commit_metadata(location, data)
    return data


def test_a_file_source_checkpoint_goes_through_the_file_walker_and_inspection(
        storage: FsCheckpointStorage, clock: ManualClock, tmp_path) -> None:
    """FileSource's positions used to be {"files": [names]}: the walker read each name as
    a state file entry, so `checkpoints list/verify`, `doctor` and discard_completed (after
    deleting `_metadata`) raised on every FileSource job."""
    from sparkpoint.connectors.files import FileSource
    from sparkpoint.storage.handles import checkpoint_file_entries, iter_file_entries

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.json").write_text("{}")
    source = FileSource(str(inbox), schema="v string")
    current = source.plan(source.initial_positions()).end
    assert "files" not in current                      # no collision with the handle convention
    legacy = {"files": ["a.json", "b.json"]}           # what checkpoints of older runs hold
    first = _file_source_checkpoint(storage, 1, legacy)
    second = _file_source_checkpoint(storage, 2, current)

    for data in (first, second):
        assert list(iter_file_entries(data.handles["source:files"])) == []
        assert [e.path for e in checkpoint_file_entries(data.handles)] == [
            f"shared/state/{data.checkpoint_id}.sst"]
    rows = list_checkpoints(storage.fs, storage.layout)
    assert [(r.checkpoint_id, r.completed, r.file_count, r.problem) for r in rows] == [
        (1, True, 1, None), (2, True, 1, None)]
    assert all(r.ok for r in verify_checkpoints(storage.fs, storage.layout))
    report = doctor(storage.fs, storage.layout, clock=clock, hash_files=True)
    assert report.healthy, report.findings

    storage.discard_completed(1, still_referenced=list(second.handles.values()))
    assert not storage.fs.exists(storage.layout.checkpoint(1))
    assert not storage.fs.exists(storage.layout.join("shared/state/1.sst"))
    assert storage.fs.exists(storage.layout.join("shared/state/2.sst"))


def test_a_file_source_resumes_from_positions_of_older_runs(tmp_path) -> None:
    from sparkpoint.connectors.files import FileSource

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for name in ("a.json", "b.json"):
        (inbox / name).write_text("{}")
    source = FileSource(str(inbox), schema="v string")
    plan = source.plan({"files": ["a.json"]})
    assert sorted(set(*plan.end.values()) - set(*plan.start.values())) == ["b.json"]
    assert source.lag({"files": ["a.json"]}) == {next(iter(plan.end)): 1}
    assert source.plan(plan.end).empty
