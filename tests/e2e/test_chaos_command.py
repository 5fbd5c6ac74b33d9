"""Issue 11.5 acceptance: `sparkpoint chaos examples/demo.py` passes.

A short variant: the demo reads DEMO_EVENTS (fewer events), `--set` checkpoints every
second, two SIGKILLs. The command runs as a real subprocess; it starts the real
`sparkpoint run` processes itself and compares their committed output with its own
fault-free run's.
"""

from __future__ import annotations

import json
from collections import Counter
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkpoint.ops.chaos import compare

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SHORT = ["--set", "execution.checkpointing.interval=1s", "--kills", "2", "--parallel", "2"]


def _chaos(tmp_path: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, DEMO_EVENTS="100000", PYSPARK_PYTHON=sys.executable)
    return subprocess.run([sys.executable, "-m", "sparkpoint.ops.cli", "chaos", "examples/demo.py", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_chaos_on_the_demo_passes_every_fault(tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = _chaos(tmp_path, *SHORT, "--seed", "11", "--workdir", str(work), "--json")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert report["ok"] and report["reference"]["rows"] > 0
    verdicts = {v["fault"]: v for v in report["faults"]}
    assert list(verdicts) == ["kill9", "outage", "corrupt", "second"]
    for fault, v in verdicts.items():
        assert v["passed"] and v["lost"] == 0 and v["duplicated"] == 0 and v["unexpected"] == 0, (fault, v)
        assert v["committed"] == report["reference"]["rows"], (fault, v)
    assert verdicts["kill9"]["restarts"] >= 1
    assert verdicts["outage"]["restarts"] == 0
    assert verdicts["corrupt"]["restarts"] >= 1
    assert "refused" in verdicts["second"]["injected"]
    # Every run left its log in the work directory.
    assert (work / "reference" / "run.log").exists() and (work / "second" / "second.log").exists()


def test_chaos_refuses_a_sink_path_it_cannot_redirect(tmp_path: Path) -> None:
    pipeline = tmp_path / "absolute.py"
    pipeline.write_text(
        "from sparkpoint import GeneratorSource, ParquetSink, Pipeline\n"
        "pipeline = Pipeline('abs').source(GeneratorSource(total_events=10))"
        f".sink(ParquetSink({str(tmp_path / 'out')!r}))\n")
    proc = subprocess.run([sys.executable, "-m", "sparkpoint.ops.cli", "chaos", str(pipeline),
                           "--workdir", str(tmp_path / "work")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "which every run would share" in proc.stderr and "SPARKPOINT_CHAOS_RUN_DIR" in proc.stderr
    assert not (tmp_path / "work" / "reference").exists()


def test_compare_counts_lost_duplicated_and_unexpected_rows_as_multisets() -> None:
    expected = Counter({(1, "a"): 1, (2, "b"): 2, (3, "c"): 1})
    assert compare(expected, Counter(expected))["lost"] == 0
    got = Counter({(1, "a"): 2, (2, "b"): 1, (9, "z"): 1})  # one twice, one of two missing, one gone, one new
    assert compare(expected, got) == {"expected": 4, "committed": 4, "lost": 2, "duplicated": 1, "unexpected": 1}
