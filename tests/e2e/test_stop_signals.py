"""Real signals to a real `sparkpoint run`: SIGTERM stops a job with a last checkpoint
whose output is committed, so the next run resumes from it and says so; a second Ctrl-C
cancels at once. The stop itself (what the handler queues), its committed output and the
resume are also covered in-process: tests/integration/test_crash_restore.py."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.harness import AGGREGATE_PIPELINE, Job, canonical

pytestmark = pytest.mark.e2e

SUMMARY = re.compile(r"job \S+ (\w+): (\d+) epochs")


def _job(tmp_path: Path) -> Job:
    # Slow enough to be stopped half-way: 200 keys, 2,000 records an epoch, 300,000 in all.
    return Job(tmp_path, name="signals", template=AGGREGATE_PIPELINE, total=300_000, per_epoch=2_000)


def test_a_second_ctrl_c_cancels_at_once(tmp_path: Path) -> None:
    job = _job(tmp_path)
    proc = job.start()
    try:
        proc.wait_for(r"RUNNING epoch \d+", timeout=120)
        proc.popen.send_signal(signal.SIGINT)
        proc.wait_for(r"SIGINT: stopping with a last checkpoint", timeout=30)
        proc.popen.send_signal(signal.SIGINT)
        started = time.monotonic()
        assert proc.wait(60) == 0, proc.tail()
        assert time.monotonic() - started < 30
    finally:
        if proc.popen.poll() is None:
            proc.kill9()
    assert SUMMARY.search(proc.text).group(1) in ("CANCELED", "FINISHED"), proc.tail()


def test_sigterm_to_the_whole_process_group_is_the_same_clean_stop(tmp_path: Path) -> None:
    """systemd (KillMode=control-group), supervisord (stopasgroup), `kill -TERM -PGID` and
    container runtimes signal the driver's JVM and Python workers too, not only the driver.
    The stop must still be the clean one: a last checkpoint whose output is committed and
    exit 0 (or, if the JVM were gone, "stopped by signal; resume from checkpoint N"), never
    a failover loop or a permanent-failure verdict."""
    job = _job(tmp_path)
    first = job.start()
    try:
        first.wait_for(r"completed checkpoint \d+ of job", timeout=120)
        os.killpg(first.popen.pid, signal.SIGTERM)  # the harness starts each job in its own group
        rc = first.wait(120)
    finally:
        if first.popen.poll() is None:
            first.kill9()
    text = first.text
    assert rc == 0, first.tail()
    assert "SIGTERM: stopping with a last checkpoint" in text, first.tail()
    assert "fails on the same input every time" not in text, first.tail()
    assert "failing over" not in text and "Traceback" not in text, first.tail()
    last = int(re.search(r"last completed: (\d+)", text).group(1))
    status = SUMMARY.search(text).group(1)
    if status == "FINISHED":  # the JVM outlived the signal: the last checkpoint was taken and committed
        assert "stopped with a last checkpoint; its output is committed" in text, first.tail()
    else:
        assert status == "CANCELED" and f"resume from checkpoint {last}" in text, first.tail()
    committed = canonical(job.output())
    assert committed, "the output of the last completed checkpoint is committed"

    second = job.start(["sparkpoint.progress=false"])
    try:
        m = second.wait_for(r"resuming from checkpoint (\d+)", timeout=120)
        assert int(m.group(1)) == last, second.tail()
    finally:
        second.kill9()
