"""What the lease tells a user: a live holder is running and is stopped,
not waited for; a dead holder on this host is dead and the next run takes over at once."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from sparkpoint.errors import LeaseHeldError
from sparkpoint.ops.inspect_cli import doctor_report
from sparkpoint.storage.checkpoint_storage import open_job_storage

JOB = "sessions"


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _findings(directory: Path) -> dict:
    report = doctor_report(str(directory), JOB)
    return {f["code"]: f for f in report.to_dict()["jobs"][0]["findings"]}


def test_a_second_copy_is_told_the_job_is_running_and_how_to_stop_it(tmp_path: Path) -> None:
    url = str(tmp_path / "checkpoints")
    holder = open_job_storage(url, JOB, run_id="run-a", host="box-1", pid=4242, lease_ttl_s=15)
    holder.lease.acquire()
    with pytest.raises(LeaseHeldError) as refused:
        open_job_storage(url, JOB, run_id="run-b", lease_ttl_s=15).lease.acquire()
    text = str(refused.value)
    assert "still running" in text and "(host box-1, pid 4242" in text, text
    assert f"sparkpoint stop --checkpoint-dir {url} --job {JOB}" in text, text
    assert "wait" not in text and "expire" not in text, text


def test_a_holder_that_stopped_renewing_is_waited_out(tmp_path: Path) -> None:
    url = str(tmp_path / "checkpoints")
    open_job_storage(url, JOB, run_id="run-a", host="box-1", pid=4242, lease_ttl_s=15).lease.acquire()
    later = time.time() + 10  # past half the ttl without a heartbeat
    with pytest.raises(LeaseHeldError, match=r"has not renewed its lease for 10 s .* the next run takes over then"):
        open_job_storage(url, JOB, run_id="run-b", lease_ttl_s=15, clock=lambda: later).lease.acquire()


def test_doctor_calls_a_dead_holder_on_this_host_dead_and_says_the_next_run_takes_over(tmp_path: Path) -> None:
    url = tmp_path / "checkpoints"
    open_job_storage(str(url), JOB, run_id="run-a", pid=_dead_pid(), lease_ttl_s=60).lease.acquire()
    found = _findings(url)
    assert "lease-held" not in found, found
    dead = found["lease-holder-dead"]
    assert dead["severity"] == "warning" and "is dead" in dead["message"], dead
    assert "takes over at once" in dead["what_to_do"], dead


def test_doctor_on_a_live_holder_says_how_to_stop_it(tmp_path: Path) -> None:
    url = tmp_path / "checkpoints"
    open_job_storage(str(url), JOB, run_id="run-a", pid=os.getpid(), lease_ttl_s=60).lease.acquire()
    held = _findings(url)["lease-held"]
    assert "still running" in held["message"] and "sparkpoint stop --checkpoint-dir" in held["message"], held
