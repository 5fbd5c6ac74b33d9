"""Crashes and restores inside the test process (tests/inprocess.py), on the shared
SparkSession: a real windowed job dies at a chosen moment as a crash would (no clean-up,
no final checkpoint, lease and staging left as they are) and runs again on the same
directories. Every scenario ends with the committed output equal to the batch answer
computed from the input alone (failure_support.expected_windows): nothing lost, nothing
twice.

The scenarios that need a real process to die (SIGKILL of the driver with its JVM and
Python workers) stay in tests/e2e."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from failure_support import Events, expected_windows

from sparkpoint.runtime.status import JobStatus
from tests.e2e.harness import canonical, read_output
from tests.inprocess import CrashPoint, job_settings, restart, start

pytestmark = pytest.mark.spark

EVENTS = Events()
# The same records in half as many epochs (the windows, and so the batch answer, do not
# depend on epoch sizes): 8 epochs still put every crash point below in the middle of
# the run, with input left for the restart.
SHORTER = Events(per_epoch=8_000)
# Every state subtask's asynchronous part takes 1.5 s, so a crash lands while one is in flight.
SLOW_ACKS = [{"participant": "state:*", "action": "slow_ack", "seconds": 1.5}]
# After the restart, the state subtasks take 3 s to restore.
SLOW_RESTORE = [{"participant": "state:*", "action": "slow_restore", "seconds": 3}]


@pytest.fixture(scope="module")
def expected(spark) -> list[tuple]:
    return expected_windows(spark, EVENTS)


def _ids(text: str, pattern: str) -> list[int]:
    return [int(m) for m in re.findall(pattern, text)]


def _checkpoint_dirs(root: Path, job: str) -> tuple[set[str], set[str]]:
    chk = list((root / "checkpoints" / job).glob("chk-*"))
    return ({p.name for p in chk if (p / "_metadata").exists()},
            {p.name for p in chk if not (p / "_metadata").exists()})


def _assert_exactly_once(out: Path, expected: list[tuple]) -> None:
    got = canonical(read_output(out))
    assert len(got) == len(expected), "rows lost or duplicated"
    assert got == expected


def test_seed002_restart_after_a_crash_refuses_checkpoints_while_restoring_and_continues_the_ids(
        spark, tmp_path, expected):
    """Seed 002: after a restart the id counter must not start over (`chk-N/_metadata`
    already exists), and state subtasks still restoring must refuse checkpoints without
    counting them as failures."""
    name, out = "seed002", tmp_path / "out"
    first = start(EVENTS.pipeline(name, out), job_settings(tmp_path, name, **{"sparkpoint.faults": SLOW_ACKS}),
                  spark, crash_at=CrashPoint.during_async_part(after_completed=1)).wait_crashed()
    with_metadata, without_metadata = _checkpoint_dirs(tmp_path, name)
    assert with_metadata and without_metadata, "the crash must leave completed and unfinished checkpoints"
    ids_before = _ids(first.text, r"triggering checkpoint (\d+)")

    second = restart(first, EVENTS.pipeline(name, out), spark,
                     job_settings(tmp_path, name, **{"sparkpoint.faults": SLOW_RESTORE}))
    result = second.wait()

    assert result.status is JobStatus.FINISHED, second.tail()
    assert "took over job 'seed002'" in second.text, "the crashed run's lease expired and was taken over"
    assert second.job.restored_from == max(int(n.split("-")[1]) for n in with_metadata)
    assert second.job.reasons().get("NOT_ALL_REQUIRED_TASKS_RUNNING"), "checkpoints are refused while restoring"
    assert JobStatus.FAILING not in second.job.status.history, "refusals while restoring must not fail the job"
    ids_after = _ids(second.text, r"triggering checkpoint (\d+)")
    assert ids_after and min(ids_after) > max(ids_before), "checkpoint ids continue after the restart"
    assert second.job.completed_ids, "checkpoints complete once restored"
    for run in (first, second):
        assert "already exists" not in run.text
    _assert_exactly_once(out, expected)


# Paced input, so the job is still running when it is stopped (windows do not depend on
# pacing): 7.5 s at least, however fast the machine, where the runs need 5 checkpoints
# at 300 ms (each epoch takes at most 6 000 records, so a slow machine's runs are longer).
LIFECYCLE = Events(keys=300, total=90_000, per_epoch=6_000, rate_per_s=12_000)
LIFECYCLE_INTERVAL = {"execution.checkpointing.interval": "300 ms"}


@pytest.fixture(scope="module")
def lifecycle_expected(spark) -> list[tuple]:
    return expected_windows(spark, LIFECYCLE)


def test_stop_with_savepoint_move_restore_at_3_crash_rerun_rescale_to_1_equals_the_batch_answer(
        spark, tmp_path, lifecycle_expected):
    """`sparkpoint stop --savepoint` (the CLI a person uses, through the job's REST API)
    stops a windowed job at parallelism 2; the savepoint is moved; the job starts from
    the moved copy at parallelism 3, crashes, and is rerun with the same settings (it
    resumes from its own checkpoint, not the savepoint); it crashes again and finishes
    at parallelism 1 from its latest checkpoint. The committed output is the batch answer."""
    from click.testing import CliRunner

    from sparkpoint.ops.cli import cli

    name, out = "lifecycle", tmp_path / "out"
    checkpoints = str(tmp_path / "checkpoints")
    first = start(LIFECYCLE.pipeline(name, out), job_settings(tmp_path, name, **LIFECYCLE_INTERVAL,
                                                              **{"rest.enabled": True, "rest.port": 0}), spark)
    first.wait_for(r"completed checkpoint \d+ of job", timeout=240)
    first.wait_for(r"completed checkpoint \d+ of job", timeout=120, start_at=len(first.lines))
    stopped = CliRunner().invoke(cli, ["stop", "--checkpoint-dir", checkpoints, "--job", name, "--savepoint"])
    assert stopped.exit_code == 0, stopped.output
    savepoint = stopped.output.strip().splitlines()[-1].split()[-1]
    result = first.wait(timeout=120)
    assert result.status is JobStatus.FINISHED and result.extra["savepoint"] == savepoint, first.tail()

    moved = tmp_path / "moved-savepoint"
    shutil.copytree(savepoint, moved)
    shutil.rmtree(savepoint)
    from_savepoint = {"execution.state-recovery.path": str(moved), "parallelism.default": 3, **LIFECYCLE_INTERVAL}

    second = start(LIFECYCLE.pipeline(name, out), job_settings(tmp_path, name, **from_savepoint), spark)
    second.wait_for(r"resuming from savepoint \d+ .* in " + re.escape(str(moved)), timeout=240)
    second.wait_for(r"rescaled operator windows from parallelism 2 to 3", timeout=30)
    mark = len(second.lines)
    second.wait_for(r"completed checkpoint \d+ of job", timeout=120, start_at=mark)
    second.wait_for(r"completed checkpoint \d+ of job", timeout=120, start_at=len(second.lines))
    second.crash()

    third = restart(second, LIFECYCLE.pipeline(name, out), spark)  # the same settings, after a crash
    third.wait_for(r"resuming from checkpoint \d+ ", timeout=240)
    assert "resuming from savepoint" not in third.text
    third.wait_for(r"completed checkpoint \d+ of job", timeout=120, start_at=len(third.lines))
    third.crash()

    last = restart(third, LIFECYCLE.pipeline(name, out), spark,
                   job_settings(tmp_path, name, **{"parallelism.default": 1, **LIFECYCLE_INTERVAL}))
    assert last.wait(timeout=400).status is JobStatus.FINISHED, last.tail()
    assert "rescaled operator windows from parallelism 3 to 1" in last.text, last.tail()

    _assert_exactly_once(out, lifecycle_expected)
    assert (moved / "_metadata").exists()  # NO_CLAIM: never deleted


def _lease_of(tmp_path: Path, name: str):
    from sparkpoint.storage.fs import StorageFS
    from sparkpoint.storage.layout import JobLayout
    from sparkpoint.storage.lease import read_current_lease

    fs = StorageFS.from_url(str(tmp_path / "checkpoints"))
    return read_current_lease(fs, JobLayout(f"{fs.root}/{name}"))


@pytest.mark.parametrize("crash_at", [
    CrashPoint.after_epoch(3),
    CrashPoint.after_metadata(2),
    CrashPoint.before_savepoint_metadata(),
], ids=["after-epoch-3", "after-metadata-before-commit", "during-a-savepoint"])
def test_a_crash_at_any_point_leaves_the_lease_and_staging_and_the_restart_commits_exactly_once(
        spark, tmp_path, expected, crash_at):
    """Wherever the driver dies, nothing it would have done afterwards happens (its lease
    is not released, no final checkpoint, no later `_metadata`), and the next run on the
    same directories takes over and commits every window exactly once."""
    name, out = "crashes", tmp_path / "out"
    first = start(SHORTER.pipeline(name, out), job_settings(tmp_path, name), spark, crash_at=crash_at)
    if crash_at.description.startswith("before a savepoint"):
        first.wait_for(r"completed checkpoint \d+ of job", timeout=240)
        first.job.stop(savepoint=True)
    first.wait_crashed()
    completed_at_crash = _checkpoint_dirs(tmp_path, name)[0]

    lease = _lease_of(tmp_path, name)
    assert lease is not None and not lease.released, "a crashed run does not release its lease"
    assert not first.job.final_done and first.job.status.status is not JobStatus.FINISHED, \
        "no final checkpoint after a crash"
    assert not list((tmp_path / "checkpoints" / name / "savepoints").glob("*/_metadata")), \
        "a savepoint cut short has no _metadata"
    assert len(canonical(read_output(out))) < len(expected), "the crash left output uncommitted"

    second = restart(first, SHORTER.pipeline(name, out), spark)
    assert second.wait().status is JobStatus.FINISHED, second.tail()
    assert _checkpoint_dirs(tmp_path, name)[0] - completed_at_crash, "the restart completed checkpoints of its own"
    if completed_at_crash:
        assert second.job.restored_from == max(int(n.split("-")[1]) for n in completed_at_crash)
    _assert_exactly_once(out, expected)


def _wait_until(condition, run, timeout: float = 240) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not reached in {timeout:.0f} s:\n{run.tail()}"
        time.sleep(0.1)


def test_a_stop_leaves_a_committed_last_checkpoint_and_the_next_run_resumes_from_it(spark, tmp_path, expected):
    """What Ctrl-C / SIGTERM ask for (the signal handler queues this same stop; the real
    signals are in tests/e2e/test_stop_signals.py): a last checkpoint whose output is
    committed, FINISHED, and the next run resumes from that checkpoint and completes the
    output exactly once."""
    name, out = "stopped", tmp_path / "out"
    paced = Events(rate_per_s=6_000)  # still running when the stop arrives
    first = start(paced.pipeline(name, out), job_settings(tmp_path, name), spark)
    # Event time 5 s in: windows have fired, so the stop has output to commit.
    _wait_until(lambda: (first.job.max_event_time or 0) >= 1_700_000_005_000, first)
    assert first.job.stop(savepoint=False).result(timeout=240) is None
    result = first.wait()
    assert result.status is JobStatus.FINISHED, first.tail()
    assert "stopped with a last checkpoint; its output is committed" in first.text, first.tail()
    committed = canonical(read_output(out))
    assert committed and len(committed) < len(expected), "the last checkpoint's output, and no more"

    second = start(paced.pipeline(name, out), job_settings(tmp_path, name), spark)  # the lease was released
    second.wait_for(rf"resuming from checkpoint {result.last_checkpoint_id} ", timeout=240)
    assert second.wait().status is JobStatus.FINISHED, second.tail()
    _assert_exactly_once(out, expected)
