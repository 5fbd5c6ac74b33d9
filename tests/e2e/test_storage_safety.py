"""Two deployments on one directory cannot corrupt a job.

Real `sparkpoint run` processes: a second deployment is refused while the first runs,
and a SIGKILLed holder is taken over at once because its process is gone (only a real
process can die). The output is compared with what the input alone gives
(tests/e2e/chaos_oracles.py). The scenarios that need no second process (retention,
nothing valid left, restore.mode=empty) run in-process:
tests/integration/test_storage_safety_inprocess.py.

Fencing of a run that lost its lease is proven at unit level with real files:
tests/unit/storage/test_storage_lease.py::test_fenced_out_holder_cannot_commit_or_heartbeat
(a fenced JobLease/FsCheckpointStorage.commit_metadata raises LeaseLostError), and
below for a holder on another host whose lease expired.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.errors import CorruptCheckpointError, LeaseHeldError, LeaseLostError
from sparkpoint.state.snapshot import SnapshotFile, snapshot_files
from sparkpoint.storage.checkpoint_storage import open_job_storage
from sparkpoint.storage.ids import encode_ids
from tests.e2e.chaos_oracles import window_rows
from tests.e2e.harness import WINDOW_PIPELINE, Job, Proc, canonical
from tests.e2e.storage_support import (
    JOB_NAME,
    SNAPSHOT_EVERY_4_EPOCHS,
    bad_magic,
    changelogs_only_in,
    flipped_bytes,
    kill_when,
    lineages,
    local_copy,
    JOB_SHAPE,
    chk_dir_ids,
    completed_checkpoints,
    completed_ids,
    expected_updates,
    job_storage,
    make_job,
    wait_completed,
)

pytestmark = pytest.mark.e2e

SPARK_TIMEOUT = 300  # seconds; the machine is small and shared


def _first_to_exit(procs: list[Proc], timeout: float) -> Proc:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.popen.poll() is not None:
                p.wait(10)
                return p
        time.sleep(0.1)
    raise AssertionError("neither deployment exited:\n" + "\n---\n".join(p.text[-1500:] for p in procs))


def _expected_windows(columns: list[str]) -> list[tuple]:
    """What WINDOW_PIPELINE commits for JOB_SHAPE's input, in `canonical`'s form."""
    return sorted(tuple(row[c] for c in columns if c != "epoch")
                  for row in window_rows(JOB_SHAPE["total"], keys=JOB_SHAPE["keys"], disorder_ms=1_000))


def test_second_deployment_is_refused_and_a_killed_holder_is_taken_over_with_fresh_ids(tmp_path: Path) -> None:
    """Seed 003 (two deployments on one directory) and seed 002 (ids start over and
    collide with existing `chk-N/_metadata`)."""
    # A long ttl: taking over at once can only come from seeing the holder's pid is dead.
    job = make_job(tmp_path / "job", template=WINDOW_PIPELINE, sets=["sparkpoint.lease.ttl=60 s"])

    deployments = [job.start(), job.start()]
    loser = _first_to_exit(deployments, timeout=120)
    winner = next(p for p in deployments if p is not loser)
    assert loser.popen.returncode == 2, loser.text[-2000:]
    refusal = loser.text
    assert re.search(rf"job '{JOB_NAME}' is held by run \S+ \(host \S+, pid {winner.popen.pid}, lease token 1\) "
                     r"since \d{4}-\d\d-\d\dT", refusal), refusal
    assert ("To stop it: `sparkpoint stop --checkpoint-dir" in refusal or "stop it first" in refusal), refusal
    assert "under another job name" in refusal, refusal

    wait_completed(winner, 2)
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
    output = job.output()
    assert canonical(output) == _expected_windows(output.column_names)


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
    # The holder renews its lease: it is running, and the way forward is to stop it, not to wait.
    assert "That run is still running" in refused.text, refused.text
    assert f"sparkpoint stop --checkpoint-dir {url} --job {JOB_NAME}" in refused.text, refused.text
    assert "kill -TERM 4242 on host other-host" in refused.text and "wait" not in refused.text, refused.text
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
    """Damage a copy: the local recovery copy hard-links files with the live DB, and the
    test means to damage exactly this one."""
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)
    damage(path)


@dataclass(frozen=True)
class _Damage:
    """Where seed 003's two corruptions go, chosen from what a killed run left."""

    latest: int
    older: int
    victim: SnapshotFile  # in storage; only `latest` references it
    local_sst: Path  # in subtask 0's local recovery copy of the snapshot `older` is based on


def _damage_plan(job: Job, fs, layout) -> _Damage | None:
    """None until the two newest completed checkpoints are such that (a) subtask 0 of
    the older one is based on a snapshot this executor still holds locally and (b) the
    latest references a change log of an epoch after the older one's."""
    try:
        done = completed_checkpoints(fs, layout)
    except (FileNotFoundError, CorruptCheckpointError):
        return None  # a subsumed checkpoint was being deleted while we listed
    if len(done) < 2:
        return None
    latest, older = sorted(done)[-1], sorted(done)[-2]
    base = lineages(done[older])["state:totals/0"]
    copy = local_copy(job, 0, base.base_epoch)
    ssts = sorted(f.name for f in (snapshot_files(base.base) if base.base is not None else [])
                  if f.name.endswith(".sst") and (copy / f.name).is_file())
    if not ssts:
        return None
    newer = changelogs_only_in(done, latest, older, "state:totals/1")
    if not newer:
        return None
    return _Damage(latest, older, newer[-1], copy / ssts[0])


def test_corrupt_local_copy_and_corrupt_remote_checkpoint_fall_back(tmp_path: Path) -> None:
    """Seed 003 ("Bad table magic number" kills the pod): a damaged local recovery copy
    is replaced from checkpoint storage; a damaged checkpoint in storage makes the job
    fall back to the next older one. With none valid the job refuses to start, and
    restore.mode=empty starts from scratch: tests/integration/test_storage_safety_inprocess.py::
    test_with_no_valid_checkpoint_the_job_refuses_to_start_and_restore_mode_empty_starts_fresh."""
    # Twice JOB_SHAPE's input: the moment to kill needs two checkpoints that share a
    # snapshot in a particular way, and a fast run of 10 epochs could end before it came.
    total = 2 * JOB_SHAPE["total"]
    job = make_job(tmp_path / "job", sets=SNAPSHOT_EVERY_4_EPOCHS, total=total)
    fs, layout = job_storage(str(job.root / "checkpoints"))
    first = job.start()
    plan = kill_when(first, lambda: _damage_plan(job, fs, layout))

    # Remote: bit rot in a change log only the latest checkpoint references (an epoch
    # after the older checkpoint's), read from storage by whichever executor rebuilds.
    flipped_bytes(Path(layout.join(plan.victim.path)), at=0)
    # Local: "Bad table magic number" in subtask 0's recovery copy of the snapshot the
    # older checkpoint is based on; the live store next to it is left intact.
    _replace_with(plan.local_sst, bad_magic)

    second = job.run(timeout=SPARK_TIMEOUT)

    text = second.text
    assert second.popen.returncode == 0, text[-3000:]
    assert re.search(rf"ALARM checkpoint {plan.latest} of job {JOB_NAME} is corrupt and is skipped; falling back "
                     rf".*{re.escape(plan.victim.name)}", text), text[-3000:]
    assert f"restores checkpoint {plan.older}" in text
    assert re.search(rf"\[{JOB_NAME}\] resuming from checkpoint {plan.older} \(epoch \d+, taken ", text), text[-3000:]
    assert re.search(rf"ALARM state:totals/0: the local recovery copy was corrupt \([^)]*"
                     rf"{re.escape(plan.local_sst.name)}[^)]*\); those files were restored from checkpoint storage",
                     text), text[-3000:]
    assert "-> FAILED" not in text
    output = job.output()
    expected = expected_updates(output.column_names, total)
    assert len(expected) > 100
    assert canonical(output, drop=()) == expected
