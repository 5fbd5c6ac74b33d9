"""Errors that restarting cannot fix stop the job with one line and a non-zero exit
as a user runs it: `sparkpoint run` at the default log level and the
default restart strategy, which used to restart such a job forever."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

PROCESSOR = """
import pandas as pd
from sparkpoint import GeneratorSource, ParquetSink, Pipeline, ProcessorOperator, StatefulProcessor

class Sessionize(StatefulProcessor):
    def init(self, handle):
        self.handle = handle
        self.seen = handle.getValueState("seen", "n BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        for pdf in rows:
            if {raise_on_key} is not None and key[0] == {raise_on_key}:
                raise ValueError(f"cannot handle key {{key[0]}}")
            if {timers}:
                self.handle.registerTimer(int(pdf["ts"].max()) + 1000)
        yield pd.DataFrame({{"key": [key[0]]}})

pipeline = (Pipeline("{job}")
    .source(GeneratorSource("events", keys=20, total_events=2000, max_records_per_epoch=1000))
    .watermark("ts", delay="1 s")
    .stateful(ProcessorOperator("sessionize", Sessionize, ["key"], "key BIGINT"))
    .sink(ParquetSink(r"{out}")))
"""


def _run(tmp_path: Path, job: str, *, raise_on_key=None, timers=False, sets=(), timeout=240):
    file = tmp_path / f"{job}.py"
    file.write_text(PROCESSOR.format(job=job, raise_on_key=raise_on_key, timers=timers, out=tmp_path / "out"))
    cmd = [sys.executable, "-m", "sparkpoint.ops.cli", "run", str(file),
           "--set", f"execution.checkpointing.dir={tmp_path / 'checkpoints'}",
           "--set", "rest.enabled=false", "--set", "sparkpoint.progress=false"]
    for s in (f"state.local.dir={tmp_path / 'state'}", *sets):
        cmd += ["--set", s]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    env.pop("SPARKPOINT_LOG_LEVEL", None)
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=timeout)
    return proc, time.monotonic() - started


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("sparkpoint: error:")]


def _no_traces(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert not re.search(r"^\s+at (org|java|scala)\.", stderr, re.M), stderr


def test_user_code_failing_on_the_same_record_stops_after_three_attempts(tmp_path: Path) -> None:
    proc, _ = _run(tmp_path, "same", raise_on_key=7)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    errors = _errors(proc.stderr)
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    assert "ValueError: cannot handle key 7" in line and "operator 'sessionize'" in line, line
    assert "restart-strategy.same-failure.max-attempts=3" in line, line
    assert "key (7,)" in line and "'key': 7" in line, line  # the key and a record it failed on
    # Two restarts (one line each), then the stop: not an endless loop.
    assert proc.stderr.count("failing over: ValueError: cannot handle key 7") == 2, proc.stderr
    trace = Path(re.search(r"full trace: (\S+?)\)", line).group(1))
    assert trace.is_file() and "ValueError: cannot handle key 7" in trace.read_text()
    _no_traces(proc.stderr)


def test_timers_without_time_mode_fail_once_without_a_restart(tmp_path: Path) -> None:
    proc, _ = _run(tmp_path, "notimemode", timers=True)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    errors = _errors(proc.stderr)
    assert len(errors) == 1, proc.stderr
    assert "uses timers but its time_mode is 'none'" in errors[0], errors[0]
    assert "failing over" not in proc.stderr, proc.stderr
    _no_traces(proc.stderr)


def test_state_local_dir_under_a_regular_file_fails_before_the_first_epoch(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    proc, took = _run(tmp_path, "localdir", sets=[f"state.local.dir={tmp_path / 'a-file' / 'state'}"])
    assert proc.returncode != 0, proc.stdout + proc.stderr
    errors = _errors(proc.stderr)
    assert len(errors) == 1 and "state.local.dir=" in errors[0] and "a-file" in errors[0], proc.stderr
    assert "failing over" not in proc.stderr and "starting fresh" not in proc.stdout, proc.stdout + proc.stderr
    _no_traces(proc.stderr)
    assert took < 30, f"it should fail before Spark starts, took {took:.0f} s"
