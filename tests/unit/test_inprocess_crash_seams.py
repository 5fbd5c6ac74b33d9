"""The in-process crash harness (tests/inprocess.py) at its seams, without Spark: once a
run crashed, nothing it asks of checkpoint storage or of its sink happens, so its
clean-up cannot release its lease or commit what it staged."""

from __future__ import annotations

import pytest

from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout
from sparkpoint.storage.lease import JobLease, read_current_lease
from tests.inprocess import CrashingSink, CrashingStorageFS, CrashPoint, CrashSwitch, RunCrashed


def _fs(tmp_path, switch: CrashSwitch) -> tuple[CrashingStorageFS, JobLayout]:
    inner = StorageFS.from_url(str(tmp_path))
    return CrashingStorageFS(inner, switch), JobLayout(f"{inner.root}/job")


def test_a_crash_after_the_nth_metadata_keeps_it_and_refuses_everything_after(tmp_path) -> None:
    switch = CrashSwitch(CrashPoint.after_metadata(2))
    fs, layout = _fs(tmp_path, switch)
    fs.create_exclusive(layout.metadata(1), b"{}")
    assert not switch.crashed

    with pytest.raises(RunCrashed):
        fs.create_exclusive(layout.metadata(2), b"{}")

    assert switch.crashed and "after checkpoint #2's _metadata" in switch.where
    assert (tmp_path / "job" / "chk-2" / "_metadata").exists(), "the crash comes after the write"
    with pytest.raises(RunCrashed):
        fs.rm(layout.checkpoint(1), recursive=True)
    assert (tmp_path / "job" / "chk-1" / "_metadata").exists()
    with pytest.raises(RunCrashed):
        fs.exists(layout.metadata(1))


def test_a_crashed_runs_lease_is_not_released_by_its_clean_up(tmp_path) -> None:
    switch = CrashSwitch()
    fs, layout = _fs(tmp_path, switch)
    lease = JobLease(fs, layout, run_id="crashed", ttl_s=3)
    lease.acquire()

    switch.crash("crashed by the test")
    lease.release()  # what a clean shutdown would do

    record = read_current_lease(StorageFS.from_url(str(tmp_path)), layout)
    assert record.run_id == "crashed" and not record.released


def test_a_crashed_runs_sink_commits_nothing_and_a_crash_point_fires_after_the_epoch_is_staged() -> None:
    calls = []

    class Sink:
        name = "out"

        def stage_epoch(self, epoch, handles):
            calls.append(("stage", epoch))

        def commit(self, handle):
            calls.append(("commit", handle))

    switch = CrashSwitch(CrashPoint.after_epoch(1))
    sink = CrashingSink(Sink(), switch)
    sink.stage_epoch(0, [])
    with pytest.raises(RunCrashed):
        sink.stage_epoch(1, [])
    with pytest.raises(RunCrashed):
        sink.commit({"epochs": [0, 1]})

    assert calls == [("stage", 0), ("stage", 1)] and sink.name == "out"
