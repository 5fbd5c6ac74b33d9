"""The web dashboard of a real `sparkpoint run` process, rendered by headless Chromium."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from sparkpoint.ops.control_cli import ControlError, locate
from tests.e2e.harness import AGGREGATE_PIPELINE, Job

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

SCREENSHOTS = Path(os.environ.get("SPARKPOINT_SCREENSHOTS", "/tmp/sparkpoint-screenshots"))


def _chromium() -> str:
    # `make test` installs Debian's package; a test never installs software itself.
    path = Path("/usr/bin/chromium")
    if not path.exists():
        pytest.fail("chromium is not installed at /usr/bin/chromium: `make test` installs it (apt-get install chromium)")
    return str(path)


def _browser(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", f"--user-data-dir={profile}", "--window-size=1280,1400", *args],
                          capture_output=True, text=True, timeout=120)


def test_dashboard_shows_the_checkpoint_history_of_a_running_job(tmp_path):
    chromium = _chromium()
    job = Job(tmp_path, name="dashboard", template=AGGREGATE_PIPELINE, keys=50, total=50_000_000, per_epoch=2_000,
              sets=["rest.port=0", "execution.checkpointing.interval=500 ms"])
    proc = job.start()
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                running = locate(str(tmp_path / "checkpoints"), "dashboard")
                with urllib.request.urlopen(f"{running.address}/jobs/dashboard/checkpoints", timeout=10) as r:
                    if b'"status": "COMPLETED"' in r.read():
                        break
            except (ControlError, OSError):
                pass
            assert time.monotonic() < deadline and proc.popen.poll() is None, proc.tail()
            time.sleep(0.5)

        # The page polls once a second; virtual time lets it render a few rounds.
        dom = _browser(chromium, tmp_path / "profile", "--virtual-time-budget=6000", "--dump-dom",
                       running.address + "/")
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        assert re.search(r'id="job-name"[^>]*>dashboard<', html)
        assert re.search(r'id="job-state"[^>]*>RUNNING<', html)
        completed_rows = re.findall(r'<tr data-id="(\d+)" data-status="COMPLETED">', html)
        assert len(completed_rows) >= 1, html[:3000]
        assert re.search(r'<rect [^>]*class="COMPLETED"[^>]*data-status="COMPLETED"', html), "timeline"
        assert re.search(r'id="checkpoint-counts"[^>]*>[1-9]\d* completed', html)
        records = re.search(r'id="records-in"[^>]*>([\d,]+)<', html)
        assert records and int(records.group(1).replace(",", "")) > 0
        assert re.search(r'<tr data-participant="state:totals/0">', html), "participants of the latest checkpoint"
        assert 'id="error" class="error" hidden' in html

        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shot = SCREENSHOTS / "dashboard.png"
        done = _browser(chromium, tmp_path / "profile", "--virtual-time-budget=6000", f"--screenshot={shot}",
                        running.address + "/")
        assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]
    finally:
        if proc.popen.poll() is None:
            os.killpg(proc.popen.pid, signal.SIGTERM)
        proc.popen.wait(120)
