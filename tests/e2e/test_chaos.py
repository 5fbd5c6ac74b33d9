"""One windowed job goes through everything at once and still
commits exactly the failure-free run's output.

Real `sparkpoint run` processes (real Spark, real RocksDB, local checkpoint storage):
a second deployment of the running job is refused; checkpoint storage becomes
unreachable for twice the lease ttl while the job runs (it keeps processing, pauses
committing, then holds its lease again and checkpoints complete); the run is
SIGKILLed, its newest checkpoint is damaged in storage, and the restart falls back to
the older one with an alarm; that run is SIGKILLed too, inside a checkpoint's
asynchronous part (its Python workers die mid-upload), and the last one finishes.
The same crash moment in one process, with the lease and id checks, is
tests/integration/test_crash_restore.py (seed 002).

The expected output is computed from the generator's input (tests/e2e/chaos_oracles.py):
no event is late (disorder 1 s, watermark delay 2 s), so the windows do not depend on
where epochs begin, and no failure-free reference job has to run beside the chaos.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from sparkpoint.errors import CorruptCheckpointError
from tests.e2e.chaos_oracles import window_rows
from tests.e2e.harness import Job, Proc, canonical
from tests.e2e.storage_support import (
    COMPLETED,
    changelogs_only_in,
    completed_checkpoints,
    flipped_bytes,
    job_storage,
    kill_when,
    wait_completed,
)

pytestmark = pytest.mark.e2e

NAME = "chaos"
# ~70 epochs: long enough that the first two runs never reach the end of the input,
# however fast the machine.
SHAPE = dict(name=NAME, keys=200, total=140_000, per_epoch=2_000)
LEASE_TTL_S = 4  # the harness runs every job with sparkpoint.lease.ttl=4 s
# Twice the ttl, and short enough that the checkpoints failing meanwhile (one a second)
# stay within tolerable-failed-checkpoints (10): the outage alone must not fail over.
OUTAGE_S = 2 * LEASE_TTL_S + 0.5
TIMEOUT = 240  # seconds, per step; the machine is small and shared
# Every state upload sleeps 1.5 s (the restarted run only), so a kill right after one
# starts lands inside it.
SLOW_ASYNC = 'sparkpoint.faults=[{participant: "state:*", action: slow_ack, seconds: 1.5}]'
PROGRESS = re.compile(rf"^\[{NAME}\] RUNNING epoch (\d+) ")


def _epochs(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for m in map(PROGRESS.search, lines) if m]


def _index_of(proc: Proc, pattern: str, start_at: int = 0) -> int:
    """Line number of the first match at or after `start_at` (waits for it)."""
    line = proc.wait_for(pattern, timeout=TIMEOUT, start_at=start_at).string
    return proc.lines.index(line, start_at)


def _no_failover(proc: Proc) -> None:
    assert "-> FAILING" not in proc.text, proc.text[-4000:]
    assert "-> FAILED" not in proc.text, proc.text[-4000:]


def _storage_outage(proc: Proc, job_dir: Path, seconds: float) -> tuple[int, int]:
    """Make the job's checkpoint directory unreachable for `seconds` (renamed away, a
    plain file in its place: every write below it fails, also for root), then bring it
    back. Returns the log line numbers where the outage began and ended."""
    away = job_dir.with_name(job_dir.name + ".unreachable")
    began = len(proc.lines)
    job_dir.rename(away)
    job_dir.write_text("checkpoint storage is unreachable\n")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.popen.poll() is None, f"the run died during the storage outage:\n{proc.text[-4000:]}"
        time.sleep(0.25)
    ended = len(proc.lines)
    job_dir.unlink()
    away.rename(job_dir)
    return began, ended


def test_chaos_windowed_job_under_storage_outage_sigkills_corruption_and_a_second_deployment_equals_the_failure_free_run(  # noqa: E501
        tmp_path: Path) -> None:
    runs: dict[str, Proc] = {}
    try:
        _chaos(tmp_path, runs)
    finally:
        for name, proc in runs.items():  # nothing keeps running; every log stays for a post-mortem
            if proc.popen.poll() is None:
                proc.kill9()
            (tmp_path / f"{name}.log").write_text(proc.text)


def _chaos(tmp_path: Path, runs: dict[str, Proc]) -> None:
    job = Job(tmp_path / "job", **SHAPE)
    job_dir = job.root / "checkpoints" / NAME
    fs, layout = job_storage(str(job.root / "checkpoints"), job_name=NAME)

    first = runs["first"] = job.start()
    wait_completed(first, 2, TIMEOUT)

    # (d) A second deployment of the running job is refused and disturbs nothing.
    second_deployment = runs["second-deployment"] = job.start()
    assert second_deployment.wait(TIMEOUT) != 0, second_deployment.text[-3000:]
    refusal = second_deployment.text
    assert re.search(rf"job '{NAME}' is held by run \S+ \(host \S+, pid {first.popen.pid}, lease token 1\) since ",
                     refusal), refusal[-3000:]
    # The holder renews its lease: it is running, and the refusal says how to stop it.
    assert "That run is still running" in refusal and "`sparkpoint stop --checkpoint-dir" in refusal, refusal[-3000:]
    assert "RUNNING epoch" not in refusal and not re.search(COMPLETED, refusal)
    wait_completed(first, first.count(COMPLETED) + 1, TIMEOUT)

    # (a) Checkpoint storage unreachable for twice the lease ttl: the run keeps going.
    began, ended = _storage_outage(first, job_dir, OUTAGE_S)
    during = first.lines[began:ended]
    assert len(set(_epochs(during))) >= 2, "epochs kept running during the outage:\n" + "\n".join(during[-40:])
    assert any("pauses committing checkpoints" in line for line in during), "\n".join(during[-40:])
    back = _index_of(first, rf"holds the lease of job '{NAME}' again \(token \d+\)", ended)
    _index_of(first, COMPLETED, back)  # checkpoints complete again after the outage
    assert first.popen.poll() is None
    _no_failover(first)

    # (b) SIGKILL, at a moment the newest checkpoint references a change log no older
    # one does; (c) that change log rots in storage before the restart.
    def damage_target():
        try:
            done = completed_checkpoints(fs, layout)
        except (FileNotFoundError, CorruptCheckpointError):
            return None  # a subsumed checkpoint was being deleted while we listed
        if len(done) < 2:
            return None
        latest, older = sorted(done)[-1], sorted(done)[-2]
        own = changelogs_only_in(done, latest, older)
        return (latest, older, own[-1]) if own else None

    latest, older, victim = kill_when(first, damage_target, TIMEOUT)
    flipped_bytes(Path(layout.join(victim.path)), at=0)

    # (b) This run is SIGKILLed inside a checkpoint's asynchronous part: its state
    # uploads are slowed so the kill lands while its Python workers are uploading.
    restarted = runs["restarted"] = job.start([SLOW_ASYNC])
    alarm = _index_of(restarted, rf"ALARM checkpoint {latest} of job {NAME} is corrupt and is skipped; "
                                 rf"falling back .*{re.escape(victim.name)}")
    _index_of(restarted, rf"\[{NAME}\] resuming from checkpoint {older} \(epoch \d+, taken ", alarm)
    wait_completed(restarted, 1, TIMEOUT)
    at = restarted.wait_for(r"checkpoint (\d+): asynchronous part of state:\S+ started", timeout=TIMEOUT,
                            start_at=len(restarted.lines))  # of a checkpoint after the completed one
    time.sleep(0.3)
    in_flight = restarted.count(rf"completed checkpoint {at.group(1)} of job") == 0
    restarted.kill9()
    assert in_flight, f"the kill was meant to land inside the asynchronous part of checkpoint {at.group(1)}"
    before_last = completed_checkpoints(fs, layout)

    # (b) The second restart runs to the end.
    last = runs["last"] = job.start()
    last.wait(TIMEOUT * 2)
    assert last.popen.returncode == 0 and f"job {NAME} FINISHED" in last.text, last.text[-4000:]
    assert re.search(rf"\[{NAME}\] resuming from checkpoint {max(before_last)} ", last.text), last.text[-4000:]
    _no_failover(last)

    output = job.output()
    columns = [c for c in output.column_names if c != "epoch"]
    expected = sorted(tuple(row[c] for c in columns) for row in window_rows(
        SHAPE["total"], keys=SHAPE["keys"], disorder_ms=1_000))
    assert len(expected) > 1_000
    assert canonical(output) == expected


def test_checkpoint_storage_made_unreachable_fails_every_write_as_a_storage_error(tmp_path: Path) -> None:
    """The outage above as the storage layer sees it (no Spark): every write fails with
    StorageError, what the coordinator, the lease keeper and the executors treat as
    "storage unreachable", never with FileExistsError, which means "someone else wrote
    this" (an id collision, another writer's `_metadata`, a lease takeover)."""
    fs, layout = job_storage(str(tmp_path / "checkpoints"), job_name=NAME)
    job_dir = Path(layout.root)
    job_dir.parent.mkdir(parents=True)
    job_dir.write_text("checkpoint storage is unreachable\n")
    change_log = tmp_path / "000000000007-0123456789ab.changelog"
    change_log.write_bytes(b"changes")

    writes = {
        "the id counter (write_atomic)": lambda: fs.write_atomic(layout.ids, b"8"),
        "a checkpoint directory (makedirs)": lambda: fs.makedirs(layout.checkpoint(8)),
        "_metadata (create_exclusive)": lambda: fs.create_exclusive(layout.metadata(8), b"{}"),
        "a change log (put_file)": lambda: fs.put_file(str(change_log), layout.join(
            f"shared/state/windows/0/log/{change_log.name}")),
    }
    raised = {}
    for what, write in writes.items():
        try:
            write()
            raised[what] = None
        except Exception as e:  # noqa: BLE001 - which type is the point
            raised[what] = type(e).__name__
    assert raised == dict.fromkeys(writes, "StorageError")
