"""On real `sparkpoint run` processes: the seed scenarios that need a
process to die. The in-process rehearsals of seeds 000, 001 and 003 (and the failover
half of 002) are in tests/integration/test_failure_paths.py.

Faults are configured the way a user rehearses them (docs/faults.md):
`--set 'sparkpoint.faults=[...]'`."""

from __future__ import annotations

import re

import pytest

from tests.e2e.harness import Job, canonical
from tests.integration.failure_support import Events, expected_windows

pytestmark = pytest.mark.e2e

EVENTS = Events()
# Every state upload takes 1.5 s, so a kill lands while a checkpoint is in flight.
SLOW_UPLOADS = 'sparkpoint.faults=[{participant: "state:*", action: slow_ack, seconds: 1.5}]'
# After the restart, the state subtasks take 3 s to restore.
SLOW_RESTORE = 'sparkpoint.faults=[{participant: "state:*", action: slow_restore, seconds: 3}]'


@pytest.fixture(scope="module")
def expected() -> list[tuple]:
    from sparkpoint.runtime.spark import get_or_create_spark

    return expected_windows(get_or_create_spark("local[2]", "tests", 2), EVENTS)


def _ids(text: str, pattern: str) -> list[int]:
    return [int(m) for m in re.findall(pattern, text)]


def test_seed002_restart_after_sigkill_refuses_checkpoints_while_restoring_and_continues_the_ids(
        tmp_path, expected):
    job = Job(tmp_path / "job", keys=EVENTS.keys, total=EVENTS.total, per_epoch=EVENTS.per_epoch)
    chk_root = tmp_path / "job" / "checkpoints" / job.name

    # Run 1: killed while a checkpoint newer than a completed one is uploading.
    first = job.start([SLOW_UPLOADS])
    completed = first.wait_for(r"completed checkpoint \d+ of job", timeout=240).group(0)
    after = next(i for i, line in enumerate(list(first.lines)) if completed in line) + 1
    first.wait_for(r"checkpoint \d+: asynchronous part of state:\S+ started", timeout=120, start_at=after)
    first.kill9()
    ids_before = _ids(first.text, r"triggering checkpoint (\d+)")
    with_metadata = {p.name for p in chk_root.glob("chk-*") if (p / "_metadata").exists()}
    without_metadata = {p.name for p in chk_root.glob("chk-*") if not (p / "_metadata").exists()}
    assert with_metadata and without_metadata, "the kill must leave completed and unfinished checkpoints"

    # Run 2: restores slowly; checkpoints triggered meanwhile are refused (not counted).
    second = job.run([SLOW_RESTORE])
    text = second.text
    assert second.popen.returncode == 0 and "-> FINISHED" in text, text[-3000:]
    assert "restores checkpoint" in text
    assert "refused: NOT_ALL_REQUIRED_TASKS_RUNNING" in text
    assert "-> FAILING" not in text, "refusals while restoring must not fail the job"
    ids_after = _ids(text, r"triggering checkpoint (\d+)")
    assert ids_after and min(ids_after) > max(ids_before), "checkpoint ids continue after the restart"
    assert _ids(text, r"completed checkpoint (\d+) of job"), "checkpoints complete once restored"
    for run in (first, second):
        assert "already exists" not in run.text

    got = canonical(job.output())
    assert len(got) == len(expected), "rows lost or duplicated"
    assert got == expected
