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
from pathlib import Path

import pytest
from failure_support import Events, expected_windows

from sparkpoint.runtime.status import JobStatus
from tests.e2e.harness import canonical, read_output
from tests.inprocess import CrashPoint, job_settings, restart, start

pytestmark = pytest.mark.spark

EVENTS = Events()
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
