"""Issue 4 acceptance: restarts, a shared directory, and bad disks cannot corrupt a job.

Real `sparkpoint run` processes (real Spark, real RocksDB), SIGKILLed and restarted;
every scenario ends by comparing the committed output with the failure-free run's.

Fencing of a run that lost its lease is proven at unit level with real files:
tests/unit/storage/test_storage_lease.py::test_fenced_out_holder_cannot_commit_or_heartbeat
(a fenced JobLease/FsCheckpointStorage.commit_metadata raises LeaseLostError), and
below for a holder on another host whose lease expired.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.errors import LeaseHeldError, LeaseLostError
from sparkpoint.state.restore import restore_snapshot
from sparkpoint.state.snapshot import referenced_files, snapshot_files, verify_snapshot
from sparkpoint.state.store import SubtaskStateStore
from sparkpoint.storage.checkpoint_storage import open_job_storage
from sparkpoint.storage.ids import encode_ids
from tests.e2e.harness import Proc, canonical
from tests.e2e.storage_support import (
    JOB_NAME,
    REFERENCE_RETAINED,
    bad_magic,
    chk_dir_ids,
    completed_checkpoints,
    completed_ids,
    flipped_bytes,
    job_storage,
    local_copy,
    make_job,
    reference,
    state_handles,
)

pytestmark = pytest.mark.e2e

SPARK_TIMEOUT = 300  # seconds; the machine is small and shared


def _wait_completed(proc: Proc, count: int, timeout: float = SPARK_TIMEOUT) -> None:
    """Until `proc` logged `count` completed checkpoints (polls the process's log)."""
    deadline = time.monotonic() + timeout
    while proc.count(r"completed checkpoint \d+ of job") < count:
        assert proc.popen.poll() is None, f"exited before {count} checkpoints:\n{proc.text[-3000:]}"
        assert time.monotonic() < deadline, f"no {count} checkpoints in time:\n{proc.text[-3000:]}"
        time.sleep(0.2)


def _first_to_exit(procs: list[Proc], timeout: float) -> Proc:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.popen.poll() is not None:
                p.wait(10)
                return p
        time.sleep(0.1)
    raise AssertionError("neither deployment exited:\n" + "\n---\n".join(p.text[-1500:] for p in procs))


def test_second_deployment_is_refused_and_a_killed_holder_is_taken_over_with_fresh_ids(
        tmp_path: Path, tmp_path_factory) -> None:
    """Seed 003 (two deployments on one directory) and seed 002 (ids start over and
    collide with existing `chk-N/_metadata`)."""
    expected = reference(tmp_path_factory).rows
    # A long ttl: taking over at once can only come from seeing the holder's pid is dead.
    job = make_job(tmp_path / "job", sets=["sparkpoint.lease.ttl=60 s"])

    deployments = [job.start(), job.start()]
    loser = _first_to_exit(deployments, timeout=120)
    winner = next(p for p in deployments if p is not loser)
    assert loser.popen.returncode == 2, loser.text[-2000:]
    refusal = loser.text
    assert re.search(rf"job '{JOB_NAME}' is held by run \S+ \(host \S+, pid {winner.popen.pid}, lease token 1\) "
                     r"since \d{4}-\d\d-\d\dT", refusal), refusal
    assert "To take over: stop that run" in refusal and "or start this job under another job name" in refusal

    _wait_completed(winner, 2)
    winner.kill9()

    # What the killed run left, plus what seed 002 describes: the id counter forgot
    # (back to 1), an unfinished chk dir above every id, and one holding a `_metadata`.
    fs, layout = job_storage(str(job.root / "checkpoints"))
    done = completed_checkpoints(fs, layout)
    assert done, "the killed run completed checkpoints"
    highest = max(chk_dir_ids(fs, layout))
    fs.write_atomic(layout.ids, encode_ids(1))
    fs.makedirs(layout.checkpoint(highest + 2))
    fs.write_atomic(layout.join(f"chk-{highest + 2}", "leftover"), b"from a crashed writer")
    fs.makedirs(layout.checkpoint(highest + 4))
    fs.write_atomic(layout.metadata(highest + 4), fs.read_bytes(layout.metadata(max(done))))

    resumed = job.start()
    assert resumed.wait(SPARK_TIMEOUT) == 0, resumed.text[-3000:]
    text = resumed.text
    assert "no longer running; taking over without waiting" in text, text[-3000:]
    assert f"restores checkpoint {max(done)}" in text
    triggered = [int(x) for x in re.findall(r"triggering checkpoint (\d+) ", text)]
    assert triggered and min(triggered) == highest + 5, (highest, triggered)
    assert completed_ids(resumed) and min(completed_ids(resumed)) > highest + 4
    assert "already exists" not in text and "Collision" not in text and "Traceback" not in text
    assert canonical(job.output(), drop=()) == expected


def _metadata_for(job_name: str, checkpoint_id: int) -> CompletedCheckpointData:
    return CompletedCheckpointData(job_name=job_name, checkpoint_id=checkpoint_id, trigger_timestamp_ms=1,
                                   completion_timestamp_ms=2, handles={"job": {"epoch": 0}})


def test_live_lease_of_another_host_refuses_the_run_and_an_expired_one_is_fenced_out(tmp_path: Path) -> None:
    job = make_job(tmp_path / "job")
    url = str(job.root / "checkpoints")
    other = open_job_storage(url, JOB_NAME, run_id="deploy-b", host="other-host", pid=4242, lease_ttl_s=60)
    other.lease.acquire()

    refused = job.run(timeout=120)

    assert refused.popen.returncode == 2, refused.text[-2000:]
    assert "held by run deploy-b (host other-host, pid 4242, lease token 1)" in refused.text
    assert re.search(r"To take over: stop that run \(host other-host, pid 4242\) or wait \d+ s for its lease "
                     r"to expire", refused.text), refused.text
    assert not (job.root / "out").exists(), "a refused run must not touch the output"

    # Another host's holder is judged by its heartbeat only (its pid means nothing here).
    now = time.time()
    contender = open_job_storage(url, JOB_NAME, run_id="deploy-c", lease_ttl_s=60, clock=lambda: now + 30)
    with pytest.raises(LeaseHeldError, match="other-host"):
        contender.lease.acquire()
    contender = open_job_storage(url, JOB_NAME, run_id="deploy-c", lease_ttl_s=60, clock=lambda: now + 61)
    assert contender.lease.acquire().token == 2

    location = other.checkpoints.initialize_location(1)
    with pytest.raises(LeaseLostError, match="fenced out.*deploy-c"):
        other.checkpoints.commit_metadata(location, _metadata_for(JOB_NAME, 1))
    assert not other.fs.exists(other.layout.metadata(1))


def _replace_with(path: Path, damage) -> None:
    """Damage a copy: the local recovery copy hard-links files with the live DB and with
    other copies, and the test means to damage exactly this one."""
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)
    damage(path)


def test_corrupt_local_copy_and_corrupt_remote_checkpoint_fall_back_then_nothing_valid_refuses(
        tmp_path: Path, tmp_path_factory) -> None:
    """Seed 003 ("Bad table magic number" kills the pod): a damaged local recovery copy
    is replaced from checkpoint storage; a damaged checkpoint in storage makes the job
    fall back to the next older one; with none valid the job refuses to start, and
    restore.mode=empty starts from scratch."""
    expected = reference(tmp_path_factory).rows
    job = make_job(tmp_path / "job")
    first = job.start()
    _wait_completed(first, 3)
    first.kill9()

    fs, layout = job_storage(str(job.root / "checkpoints"))
    done = completed_checkpoints(fs, layout)
    assert len(done) >= 2, sorted(done)
    latest, older = sorted(done)[-1], sorted(done)[-2]
    # Remote: bit rot in a file only the latest checkpoint references (subtask 1), and
    # subtask 1's local copy of it is gone (new machine), so storage must be read.
    kept_by_others = set().union(*(referenced_files(h) for cid, d in done.items() if cid != latest
                                   for h in state_handles(d).values()))
    own = [f for f in snapshot_files(done[latest].handles["state:totals/1"]) if f.path not in kept_by_others]
    victim = max(own, key=lambda f: (f.name.endswith(".sst"), f.size))
    flipped_bytes(Path(layout.join(victim.path)))
    shutil.rmtree(local_copy(job, 1, latest))
    # Local: "Bad table magic number" in subtask 0's recovery copy of the older checkpoint.
    local_sst = sorted(local_copy(job, 0, older).glob("*.sst"))[0]
    _replace_with(local_sst, bad_magic)

    second = job.run(timeout=SPARK_TIMEOUT)

    text = second.text
    assert second.popen.returncode == 0, text[-3000:]
    assert re.search(rf"ALARM checkpoint {latest} of job {JOB_NAME} is corrupt .*{re.escape(victim.name)}", text), \
        text[-3000:]
    assert f"restores checkpoint {older}" in text
    assert re.search(rf"checkpoint {older}, state:totals/0: the local recovery copy was corrupt .*"
                     rf"{re.escape(local_sst.name)}", text), text[-3000:]
    assert canonical(job.output(), drop=()) == expected

    # Nothing valid left: every retained checkpoint damaged in storage, no local copies.
    done = completed_checkpoints(fs, layout)
    retained_files = {f.path for data in done.values() for handle in state_handles(data).values()
                      for f in snapshot_files(handle)}
    for path in retained_files:  # once each: a shared file flipped twice would be whole again
        flipped_bytes(Path(layout.join(path)), at=0)
    shutil.rmtree(job.root / "state")

    refused = job.run(timeout=SPARK_TIMEOUT)

    assert refused.popen.returncode == 2, refused.text[-3000:]
    assert re.search(rf"has {len(done)} completed checkpoint\(s\) .* but none restores", refused.text)
    assert "--set restore.mode=empty" in refused.text and "sparkpoint doctor" in refused.text
    assert canonical(job.output(), drop=()) == expected, "a refused run must not touch the output"

    from_scratch = make_job(tmp_path / "from-scratch", checkpoint_dir=str(job.root / "checkpoints"))
    empty = from_scratch.run(["restore.mode=empty"], timeout=SPARK_TIMEOUT)
    assert empty.popen.returncode == 0, empty.text[-3000:]
    assert "starts from scratch" in empty.text
    assert canonical(from_scratch.output(), drop=()) == expected


def test_retention_keeps_num_retained_checkpoints_with_every_file_they_need(
        tmp_path: Path, tmp_path_factory) -> None:
    ref = reference(tmp_path_factory)
    fs, layout = job_storage(str(ref.job.root / "checkpoints"))
    completed = completed_ids(ref.proc)
    assert len(completed) >= REFERENCE_RETAINED + 3, completed

    done = completed_checkpoints(fs, layout)

    assert sorted(done) == sorted(completed)[-REFERENCE_RETAINED:]
    assert chk_dir_ids(fs, layout) == set(done), "subsumed checkpoints leave nothing behind"
    referenced: set[str] = set()
    for data in done.values():
        for participant, handle in state_handles(data).items():
            assert verify_snapshot(handle, fs, layout) == [], participant
            referenced |= referenced_files(handle)
    shared = {layout.relative(f.path) for f in fs.find(layout.shared)}
    assert shared == {p for p in referenced if p.startswith("shared/")}, "unreferenced shared files reclaimed"

    oldest = done[min(done)]
    for participant, handle in state_handles(oldest).items():
        target = tmp_path / participant.replace(":", "-").replace("/", "-")
        restore_snapshot(handle, fs, layout, str(target))
        store = SubtaskStateStore.open(str(target), create=False)
        try:
            assert store.epoch() == oldest.handles["job"]["epoch"], participant
        finally:
            store.close()
