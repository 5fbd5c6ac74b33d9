"""The CLI sends a job's token only to the job: anyone who can write the checkpoint
directory can write a lease naming any address, so the lease's address is checked first."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from sparkpoint.ops.control_cli import ControlError, checkpoint, locate
from sparkpoint.runtime.rest import security
from sparkpoint.storage.checkpoint_storage import open_job_storage

JOB = "orders"


class _FakeJob(http.server.BaseHTTPRequestHandler):
    """Answers like a job's REST API and remembers the Authorization headers it got."""
    seen: list[tuple[str, str | None]]

    def _answer(self, body: dict, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.path, self.headers.get("Authorization")))
        self._answer({"request-id": "r1"}, 202)

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        self._answer({"status": {"id": "COMPLETED"}, "kind": "checkpoint", "operation": {"checkpointId": 7}})

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def listener():
    seen: list = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("H", (_FakeJob,), {"seen": seen}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


@pytest.fixture
def runtime_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(security.RUNTIME_DIR_ENV, str(tmp_path / "run"))
    monkeypatch.delenv("SPARKPOINT_REST_TOKEN", raising=False)
    monkeypatch.delenv("SPARKPOINT_REST_ADDRESS", raising=False)


def _lease(directory: Path, address: str, pid: int, run_id: str = "run-1"):
    storage = open_job_storage(str(directory), JOB, run_id=run_id, pid=pid, lease_ttl_s=60)
    storage.lease.acquire()
    storage.lease.publish_rest_address(address)
    return storage


def _checkpoint(directory: Path, *extra: str):
    return CliRunner().invoke(checkpoint, ["--checkpoint-dir", str(directory), "--job", JOB, *extra])


def test_the_cli_sends_the_jobs_control_token_to_the_job(tmp_path, listener, runtime_dir):
    """The reference case: this process serves the port, as the job's own process would."""
    address, seen = listener
    _lease(tmp_path, address, os.getpid())
    security.write_control_token("run-1", "the-control-token")
    done = _checkpoint(tmp_path)
    assert done.exit_code == 0, done.output
    assert done.output == "checkpoint 7 completed\n"
    assert seen[0] == (f"/jobs/{JOB}/checkpoints", "Bearer the-control-token")


def test_the_cli_does_not_send_the_token_to_a_local_port_the_job_does_not_serve(tmp_path, listener, runtime_dir):
    """Another local user's server on a port the lease names (the job died, or the lease
    was written by someone else) gets nothing."""
    address, seen = listener
    other = subprocess.Popen(["sleep", "60"])  # the lease's process: alive, but not serving the port
    try:
        _lease(tmp_path, address, other.pid)
        security.write_control_token("run-1", "the-control-token")
        done = _checkpoint(tmp_path, "--token", "the-rest-token")
    finally:
        other.kill()
        other.wait()
    assert done.exit_code == 1
    assert f"{address} is not served by the process of job 'orders' (pid {other.pid})" in done.output, done.output
    assert seen == []


def test_the_cli_does_not_send_the_token_to_an_address_off_this_machine(tmp_path, runtime_dir):
    _lease(tmp_path, "http://203.0.113.7:8081", os.getpid())
    with pytest.raises(ControlError, match=r"not this machine's loopback; if that is the job, pass --address "
                                           r"http://203.0.113.7:8081"):
        locate(str(tmp_path), JOB, token="the-rest-token")
    with pytest.raises(ControlError, match="not sending it anything"):
        locate(str(tmp_path), JOB, token="the-rest-token", address="http://203.0.113.8:8081")
    trusted = locate(str(tmp_path), JOB, token="the-rest-token", address="http://203.0.113.7:8081")
    assert trusted.address == "http://203.0.113.7:8081" and trusted.token == "the-rest-token"


def test_the_cli_does_not_send_the_token_to_a_loopback_address_of_another_host(tmp_path, runtime_dir):
    storage = open_job_storage(str(tmp_path), JOB, run_id="run-1", host="box-7", pid=4242, lease_ttl_s=60)
    storage.lease.acquire()
    storage.lease.publish_rest_address("http://127.0.0.1:8081")
    with pytest.raises(ControlError, match="runs on host box-7 .* run this command on box-7"):
        locate(str(tmp_path), JOB, token="the-rest-token")
