"""Savepoints and rescaling, in process on one local Spark session (the CLI and SIGKILL
and crash version is tests/integration/test_crash_restore.py): stop with a savepoint, move it,
start from it at another parallelism, resume from the job's own checkpoints (not the
savepoint again), rescale again from a checkpoint; the output equals the run that
never stopped."""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from failure_support import Events, expected_windows, settings
from sparkpoint.errors import ConfigError
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus
from sparkpoint.storage.metadata import decode
from tests.e2e.harness import canonical, read_output

pytestmark = pytest.mark.spark

EVENTS = Events(keys=150, total=48_000, per_epoch=3_000)
# Long enough for a 5-checkpoint outage and three checkpoints after it (1 s interval).
LONG = Events(keys=150, total=150_000, per_epoch=3_000)


class Run:
    """A JobMaster on a thread, so the test can act on it while it runs."""

    def __init__(self, spark, root, parallelism: int, events: Events = EVENTS, **extra):
        self.job = JobMaster(events.pipeline("sp", root / "out"),
                             settings(root, "sp", [], **{"parallelism.default": parallelism, **extra}), spark=spark)
        self.result = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.job.run()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def wait_until(self, condition, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition(self.job):
            assert self.thread.is_alive(), f"the job ended early: {self.error or self.result}"
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)

    def join(self, timeout_s: float = 180):
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the job did not end"
        if self.error is not None:
            raise self.error
        return self.result


def _completed(job) -> int:
    coordinator = getattr(job, "coordinator", None)
    return int(coordinator.stats.snapshot().get("completed", 0)) if coordinator else 0


def test_stop_with_savepoint_move_it_rescale_up_and_down_output_equals_the_unstopped_run(spark, tmp_path):
    expected = expected_windows(spark, EVENTS)

    # Parallelism 2; a savepoint while it runs (the job goes on), then stop with one.
    first = Run(spark, tmp_path, 2)
    first.wait_until(lambda j: j.epoch >= 2 and _completed(j) >= 1)
    running_savepoint = first.job.trigger_savepoint(str(tmp_path / "sp-while-running")).result(60)
    assert running_savepoint == str(tmp_path / "sp-while-running")
    first.wait_until(lambda j: j.epoch >= 5)
    stopped_at = first.job.stop(savepoint=True).result(120)
    result = first.join()
    assert result.status is JobStatus.FINISHED
    assert result.extra["savepoint"] == stopped_at
    assert first.job.epoch < EVENTS.total // EVENTS.per_epoch, "stopped before the input ended"
    data = decode((tmp_path / "sp-while-running" / "_metadata").read_bytes())
    assert data.properties.savepoint

    # Savepoints are self-contained: move it, and the original is gone.
    copy = tmp_path / "moved-savepoint"
    shutil.copytree(stopped_at, copy)
    shutil.rmtree(stopped_at)

    # A different max parallelism is refused with one clear error.
    with pytest.raises(ConfigError, match="max-parallelism"):
        Run(spark, tmp_path, 3, **{"execution.state-recovery.path": str(copy),
                                   "pipeline.max-parallelism": 64}).join()

    # Parallelism 3 from the moved savepoint; cancelled half-way.
    second = Run(spark, tmp_path, 3, **{"execution.state-recovery.path": str(copy)})
    second.wait_until(lambda j: j.restored_from is not None and j.epoch >= 8 and _completed(j) >= 2)
    assert second.job.restored_from == decode((copy / "_metadata").read_bytes()).checkpoint_id
    second.job.cancel()
    second.join()

    # Rerun with the same command line: resumes from its own checkpoint, not the savepoint.
    third = Run(spark, tmp_path, 3, **{"execution.state-recovery.path": str(copy)})
    third.wait_until(lambda j: j.restored_from is not None)
    assert third.job.restored_from > decode((copy / "_metadata").read_bytes()).checkpoint_id
    third.wait_until(lambda j: j.epoch >= 11 and _completed(j) >= 1)
    third.job.cancel()
    third.join()

    # Down to 1 from the latest checkpoint, to the end of the input.
    last = Run(spark, tmp_path, 1)
    assert last.join().status is JobStatus.FINISHED

    assert canonical(read_output(tmp_path / "out")) == expected
    # NO_CLAIM: the savepoint is untouched and still restorable.
    assert (copy / "_metadata").exists()


def test_a_savepoint_completes_while_checkpoints_fail_and_retention_never_deletes_it(spark, tmp_path):
    """Checkpoint storage refuses everything under chk-* for checkpoints 1-5 (seed 001's
    outage, on checkpoint directories only); a savepoint asked for meanwhile completes,
    the later checkpoints complete and subsume each other (1 retained), and the
    savepoint is still whole: a job started from it finishes with the right output."""
    expected = expected_windows(spark, LONG)
    outage = [{"op": "any", "path": "re:/chk-\\d+(/|$)", "checkpoints": list(range(1, 6)), "action": "fail"}]
    run = Run(spark, tmp_path / "a", 2, LONG, **{"sparkpoint.faults": outage,
                                           "execution.checkpointing.savepoint.allowed-targets": [str(tmp_path)],
                                           "execution.checkpointing.tolerable-failed-checkpoints": 100,
                                           "execution.checkpointing.num-retained": 1})
    run.wait_until(lambda j: j.epoch >= 2 and j.coordinator.stats.snapshot().get("failed", 0) >= 2)
    assert _completed(run.job) == 0
    target = tmp_path / "savepoint-during-outage"
    assert run.job.trigger_savepoint(str(target)).result(60) == str(target)
    run.wait_until(lambda j: _completed(j) >= 3)  # checkpoints after the outage, each subsuming the last
    run.job.cancel()
    run.join()
    files_before = sorted(p.relative_to(target) for p in target.rglob("*"))
    assert (target / "_metadata").exists()

    # Same output: what was committed after the savepoint is withdrawn and produced again.
    restored = Run(spark, tmp_path / "a", 2, LONG, **{"execution.state-recovery.path": str(target)})
    assert restored.join().status is JobStatus.FINISHED
    assert restored.job.restored_from == decode((target / "_metadata").read_bytes()).checkpoint_id
    assert canonical(read_output(tmp_path / "a" / "out")) == expected
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == files_before
