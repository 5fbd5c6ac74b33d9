"""bench/nexmark.py at tiny scale: every system's runner gives a row with positive throughput for a
query, and sparkpoint and Spark Structured Streaming emit the same number of rows for the same
events and query. PyFlink runs when bench/.venv-pyflink and its jars are there (bash
bench/pyflink/setup.sh); otherwise that part is skipped with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.e2e]  # a bench subprocess starts its own JVMs

REPO = Path(__file__).resolve().parents[2]
PYFLINK_PY = Path(os.environ.get("PYFLINK_PYTHON") or REPO / "bench" / ".venv-pyflink" / "bin" / "python")


def _run(tmp_path: Path, systems: str, queries: str, extra: list[str] | None = None) -> list[dict]:
    out = tmp_path / "runs.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(REPO / "bench" / "nexmark.py"), "--events", "3000",
                           "--files-per-stream", "2", "--files-per-epoch", "1", "--queries", queries,
                           "--systems", systems, "--work", str(tmp_path / "work"), "--json", str(out),
                           *(extra or [])], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_sparkpoint_and_spark_ss_measure_a_query_and_emit_the_same_rows(tmp_path):
    rows = {(r["system"], r["query"]): r for r in _run(tmp_path, "sparkpoint,spark-ss", "q1,q15")}
    for system in ("sparkpoint", "spark-ss"):
        r = rows[(system, "q1")]
        assert "failed" not in r, r.get("failed")
        assert r["events_per_s"] > 0 and r["peak_rss_mb"] > 0
        assert r["events"] == r["output_rows"] > 0  # q1 maps every bid to one row
    assert rows[("sparkpoint", "q1")]["output_rows"] == rows[("spark-ss", "q1")]["output_rows"]
    assert rows[("sparkpoint", "q1")]["checkpoints_completed"] >= 1
    # A query Spark SS cannot express is a row with the reason, not a gap.
    assert "distinct" in rows[("spark-ss", "q15")]["cannot_express"]


def test_pyflink_measures_a_query(tmp_path):
    jars = Path(os.environ.get("PYFLINK_JARS") or PYFLINK_PY.parent.parent / "jars")
    if not PYFLINK_PY.exists() or not jars.is_dir():
        pytest.skip(f"no PyFlink venv at {PYFLINK_PY.parent.parent} with its jars in {jars} "
                    "(bash bench/pyflink/setup.sh; PYFLINK_PYTHON and PYFLINK_JARS point elsewhere)")
    rows = _run(tmp_path, "pyflink", "q1", ["--pyflink-python", str(PYFLINK_PY)])
    assert len(rows) == 1 and "failed" not in rows[0], rows
    assert rows[0]["events_per_s"] > 0 and rows[0]["checkpoints_completed"] >= 0
