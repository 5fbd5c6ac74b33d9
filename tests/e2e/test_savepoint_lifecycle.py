"""Savepoints, stop and rescale with real processes and the CLI a person uses: a rate-limited
windowed job at parallelism 2 is stopped with a savepoint (`sparkpoint stop
--savepoint`), the savepoint is moved, the job starts from the moved copy at
parallelism 3 (`--from-savepoint`), is SIGKILLed and rerun with the same command
line (it resumes from its own checkpoint), is SIGKILLed again and finishes at
parallelism 1 from its latest checkpoint. The committed output equals the
failure-free run at parallelism 2, row for row."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.e2e.harness import Job, canonical

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

RATE_LIMITED_WINDOWS = """
from sparkpoint import GeneratorSource, ParquetSink, Pipeline, TumblingWindow
pipeline = (
    Pipeline("{job}")
    .source(GeneratorSource("events", keys={keys}, total_events={total}, max_records_per_epoch={per_epoch},
                            splits=2, disorder_ms=1_000, rate_per_s=6_000))
    .watermark("ts", delay="2 s")
    .stateful(TumblingWindow("windows", ["key"], "ts", size="2 s", aggs=("count", "sum"), value_column="value",
                             value_type="bigint"))
    .sink(ParquetSink(r"{out}"))
)
"""


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkpoint.ops.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_stop_with_savepoint_move_restore_at_3_sigkill_rerun_rescale_to_1_equals_reference(tmp_path):
    params = dict(name="lifecycle", keys=300, total=150_000, per_epoch=10_000)
    reference = Job(tmp_path / "reference", **params)
    ref = reference.run(["rest.port=0"], timeout=400)
    assert ref.popen.returncode == 0, ref.tail()
    expected = canonical(reference.output())
    assert expected

    job = Job(tmp_path / "life", template=RATE_LIMITED_WINDOWS, **params)
    checkpoints = str(job.root / "checkpoints")
    first = job.start(["rest.port=0"])
    try:
        first.wait_for(r"completed checkpoint \d+ of job", timeout=240)
        first.wait_for(r"completed checkpoint \d+ of job", timeout=60, start_at=len(first.lines))
        stopped = _cli("stop", "--checkpoint-dir", checkpoints, "--job", "lifecycle", "--savepoint")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        savepoint = stopped.stdout.strip().splitlines()[-1].split()[-1]
        assert first.wait(timeout=120) == 0, first.tail()
    finally:
        if first.popen.poll() is None:
            first.kill9()
    assert "FINISHED" in first.text and f"savepoint {savepoint}" in first.text, first.tail()

    moved = tmp_path / "moved-savepoint"
    shutil.copytree(savepoint, moved)
    shutil.rmtree(savepoint)
    from_savepoint = ["rest.port=0", f"execution.state-recovery.path={moved}", "parallelism.default=3"]

    second = job.start(from_savepoint)
    try:
        second.wait_for(r"resuming from savepoint \d+ .* in " + str(moved), timeout=240)
        second.wait_for(r"rescaled operator windows from parallelism 2 to 3", timeout=10)
        mark = len(second.lines)
        second.wait_for(r"completed checkpoint \d+ of job", timeout=120, start_at=mark)
        second.wait_for(r"completed checkpoint \d+ of job", timeout=120, start_at=len(second.lines))
    finally:
        second.kill9()

    third = job.start(from_savepoint)  # the same command line, after a crash
    try:
        third.wait_for(r"resuming from checkpoint \d+ ", timeout=240)
        assert "resuming from savepoint" not in third.text
        third.wait_for(r"completed checkpoint \d+ of job", timeout=120, start_at=len(third.lines))
    finally:
        third.kill9()

    last = job.run(["rest.port=0", "parallelism.default=1"], timeout=400)
    assert last.popen.returncode == 0, last.tail()
    assert "rescaled operator windows from parallelism 3 to 1" in last.text, last.tail()

    assert canonical(job.output()) == expected
    assert (moved / "_metadata").exists()  # NO_CLAIM: never deleted
