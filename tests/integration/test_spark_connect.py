"""A pipeline runs through a Spark Connect server (the one pyspark ships, started here on
127.0.0.1) with the same exactly-once output as on a classic session: a run that names
the server with `spark.remote` is killed (SIGKILL) after its first checkpoints, and a
second run on a session the user built resumes from them, fails over once, and finishes.
The committed output equals the batch answer over every event, each row once.

The drivers run in processes of their own: pyspark allows one kind of session per
process, and the other integration tests hold a classic one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from connect_job import EVENTS
from connect_server import REPO, connect_server, missing_client_modules

from tests.e2e.harness import canonical, read_output

pytestmark = [pytest.mark.spark, pytest.mark.e2e]

JOB_SCRIPT = Path(__file__).with_name("connect_job.py")


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory):
    missing = missing_client_modules()
    if missing:
        pytest.fail(f"the Spark Connect client is not installed (missing {', '.join(missing)}): "
                    "pip install 'pyspark[connect]' (the test extra has it)", pytrace=False)
    with connect_server(tmp_path_factory.mktemp("connect-server")) as url:
        yield url


def _driver(url: str, root: Path, session: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(JOB_SCRIPT), url, str(root), "--session", session],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _completed_checkpoints(root: Path) -> int:
    return len(list((root / "checkpoints" / "over-connect").glob("chk-*/_metadata")))


def test_a_pipeline_over_spark_connect_is_exactly_once_across_a_killed_driver(connect_url, tmp_path):
    first = _driver(connect_url, tmp_path, "config")
    deadline = time.monotonic() + 240
    while _completed_checkpoints(tmp_path) < 2:
        if first.poll() is not None:
            pytest.fail(f"the first run ended before it was killed:\n{first.stderr.read()[-4000:]}")
        assert time.monotonic() < deadline, "the first run completed no checkpoint over Spark Connect"
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    _, first_err = first.communicate(timeout=30)
    # The key a Connect client cannot set is named at start, in one line.
    ignored = [line for line in first_err.splitlines() if "spark.executor.memory" in line]
    assert len(ignored) == 1 and "pass the others to the server when it starts" in ignored[0], first_err[-3000:]

    second = _driver(connect_url, tmp_path, "handed")
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-4000:]
    result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT "):])

    assert result["status"] == "FINISHED"
    assert result["restored_from"] is not None, "the second run did not resume from the first run's checkpoints"
    assert result["restarts"] == 1  # the failover its armed first epoch caused
    expected = sorted(tuple(row) for row in result["expected"])
    assert sum(row[3] for row in expected) == EVENTS.total  # the reference counts every event once
    assert canonical(read_output(tmp_path / "out")) == expected
