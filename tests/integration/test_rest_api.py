"""The REST API, the CLI over it and /metrics, against a real running job on local Spark."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline, Settings
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.rest import RestServer
from sparkpoint.runtime.status import JobStatus

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
JOB = "rest-api"


def _request(url: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None):
    """(status, parsed JSON or text) of one request; 4xx/5xx answers too."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, raw, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, raw, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
    return status, (json.loads(raw) if "json" in ctype else raw.decode())


def _wait(what: str, check, timeout_s: float = 180):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkpoint.ops.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def running(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("rest")
    pipeline = (Pipeline(JOB)
                .source(GeneratorSource("events", keys=50, total_events=50_000_000, max_records_per_epoch=2_000, splits=2))
                .watermark("ts", "1 s")
                .stateful(KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
                .sink(ParquetSink(str(root / "out"))))
    settings = Settings.load(overrides={
        "pipeline.name": JOB, "execution.checkpointing.dir": str(root / "chk"),
        "state.local.dir": str(root / "state"), "execution.checkpointing.interval": "700 ms",
        "sparkpoint.progress": False, "rest.port": 0, "restart-strategy.type": "none"})
    job = JobMaster(pipeline, settings, spark=spark)
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("result", job.run()), daemon=True)
    thread.start()
    _wait("the REST server", lambda: getattr(job, "rest", None))
    base = job.rest.address
    _wait("two completed checkpoints",
          lambda: _request(f"{base}/jobs/{JOB}/checkpoints")[1]["counts"]["completed"] >= 2)
    yield job, base, str(root / "chk")
    job.cancel()
    thread.join(120)
    assert not thread.is_alive()


def test_overview_shows_a_running_job_with_its_progress(running):
    job, base, _ = running
    status, body = _request(f"{base}/jobs/overview")
    assert status == 200
    [overview] = body["jobs"]
    assert overview["name"] == JOB and overview["state"] == "RUNNING"
    assert overview["records-in"] > 0 and overview["epoch"] >= 0 and overview["restarts"] == 0
    assert overview["start-time"] <= time.time() * 1000 and overview["watermark"] is not None
    assert overview["lag"] > 0 and set(overview["lag-per-split"]) == {"0", "1"}
    assert overview["checkpoints"]["completed"] >= 2


def test_checkpoint_statistics_have_counts_summary_latest_and_history(running):
    _, base, _ = running
    body = _request(f"{base}/jobs/{JOB}/checkpoints")[1]
    assert body["counts"]["completed"] >= 2 and body["counts"]["failed"] == 0
    assert {"restored", "in_progress", "completed", "failed"} <= set(body["counts"])
    duration, size = body["summary"]["end_to_end_duration"], body["summary"]["state_size"]
    assert duration["count"] >= 2 and 0 <= duration["p50"] <= duration["p90"] <= duration["p99"] <= duration["max"]
    assert size["max"] > 0
    latest = body["latest"]["completed"]
    assert latest["status"] == "COMPLETED" and latest["external_path"].endswith(f"chk-{latest['id']}")
    completed = [h for h in body["history"] if h["status"] == "COMPLETED"]
    assert completed[0]["id"] == latest["id"], "history is newest first"
    for h in completed:
        assert h["trigger_timestamp"] > 0 and h["end_to_end_duration"] >= 0 and h["state_size"] >= 0
        assert h["failure_reason"] is None

    details = _request(f"{base}/jobs/{JOB}/checkpoints/details/{latest['id']}")
    assert details[0] == 200
    participants = {p["id"] for p in details[1]["participants"]}
    assert {"job", "source:events", "state:totals/0", "state:totals/1"} <= participants
    assert any(p.startswith("sink:") for p in participants)


def test_config_and_exceptions(running):
    _, base, _ = running
    config = _request(f"{base}/jobs/{JOB}/config")[1]["execution-config"]
    assert config["pipeline.name"] == JOB and config["execution.checkpointing.interval"] == 700
    assert config["rest.port"] == 0
    exceptions = _request(f"{base}/jobs/{JOB}/exceptions")[1]
    assert exceptions["failovers"] == [] and isinstance(exceptions["alarms"], list)


def test_bad_requests_get_a_4xx_with_a_json_error(running):
    _, base, _ = running
    cases = [
        ("GET", f"/jobs/nope/checkpoints", None, 404),
        ("GET", f"/jobs/{JOB}/checkpoints/details/abc", None, 400),
        ("GET", f"/jobs/{JOB}/checkpoints/details/999999", None, 404),
        ("GET", f"/jobs/{JOB}/savepoints/no-such-request", None, 404),
        ("GET", "/no/such/thing", None, 404),
        ("POST", f"/jobs/{JOB}/checkpoints", b"{not json", 400),
        ("POST", f"/jobs/{JOB}/savepoints", b'{"target-directory": 5}', 400),
        ("POST", f"/jobs/{JOB}/stop", b'{"drian": true}', 400),
        ("PUT", f"/jobs/{JOB}/checkpoints", None, 405),
    ]
    for method, path, body, expected in cases:
        status, answer = _request(base + path, method, body, {"Content-Type": "application/json"})
        assert status == expected, (method, path, status, answer)
        assert isinstance(answer, dict) and answer["errors"] and isinstance(answer["errors"][0], str)


def test_trigger_a_checkpoint_and_follow_the_request(running):
    _, base, _ = running
    status, body = _request(f"{base}/jobs/{JOB}/checkpoints", "POST", b"")
    assert status == 202
    url = f"{base}/jobs/{JOB}/checkpoints/{body['request-id']}"
    answer = _wait("the triggered checkpoint", lambda: (a := _request(url)[1])["status"]["id"] == "COMPLETED" and a)
    checkpoint_id = answer["operation"]["checkpointId"]
    history = _request(f"{base}/jobs/{JOB}/checkpoints")[1]["history"]
    assert any(h["id"] == checkpoint_id and h["status"] == "COMPLETED" for h in history)


def test_savepoint_request(running, tmp_path):
    job, base, _ = running
    status, body = _request(f"{base}/jobs/{JOB}/savepoints", "POST",
                            json.dumps({"target-directory": str(tmp_path / "sp")}).encode())
    assert status == 202
    url = f"{base}/jobs/{JOB}/savepoints/{body['request-id']}"
    answer = _wait("the savepoint", lambda: (a := _request(url)[1])["status"]["id"] == "COMPLETED" and a)
    assert "failure-cause" not in answer["operation"], answer
    assert answer["operation"]["location"] == str(tmp_path / "sp")
    assert (tmp_path / "sp" / "_metadata").exists()


def test_every_documented_metric_is_on_metrics(running):
    _, base, _ = running
    documented = set(re.findall(r"^\| `(sparkpoint_\w+)`", (REPO / "docs" / "operations.md").read_text(), re.M))
    assert len(documented) >= 20
    status, text = _request(f"{base}/metrics")
    assert status == 200
    exposed = set(re.findall(r"^# TYPE (\w+) ", text, re.M))
    # prometheus_client names a counter's family without `_total` in TYPE lines.
    exposed |= {f"{name}_total" for name in exposed}
    assert documented <= exposed, f"documented but not on /metrics: {sorted(documented - exposed)}"
    assert re.search(r'^sparkpoint_records_in_total\{job="rest-api"\} [1-9]', text, re.M)
    assert re.search(r'^sparkpoint_checkpoint_size_bytes_count\{job="rest-api"\} [1-9]', text, re.M)
    assert re.search(r'^sparkpoint_source_lag_records\{job="rest-api",split="0"\}', text, re.M)


def test_a_token_is_required_when_configured(running):
    job, _, _ = running
    guarded = RestServer(job, "127.0.0.1", 0, token="s3cret")
    try:
        status, body = _request(f"{guarded.address}/jobs/overview")
        assert status == 401 and "token" in body["errors"][0]
        status, body = _request(f"{guarded.address}/jobs/overview", headers={"Authorization": "Bearer s3cret"})
        assert status == 200 and body["jobs"][0]["name"] == JOB
    finally:
        guarded.close(linger_s=0)


def test_cli_status_and_checkpoint_find_the_job_through_its_lease(running):
    _, base, directory = running
    done = _cli("status", "--checkpoint-dir", directory, "--job", JOB)
    assert done.returncode == 0, done.stderr
    assert f"job {JOB} RUNNING" in done.stdout and base in done.stdout and "checkpoints:" in done.stdout
    done = _cli("status", "--checkpoint-dir", directory, "--job", JOB, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["job"]["state"] == "RUNNING"
    done = _cli("checkpoint", "--checkpoint-dir", directory, "--job", JOB)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"checkpoint \d+ completed\n", done.stdout)


def test_cli_on_a_job_that_is_not_running_is_one_error_line(tmp_path):
    done = _cli("status", "--checkpoint-dir", str(tmp_path), "--job", "ghost")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().count("\n") == 0 and "is not running" in done.stderr


def test_cli_stop_ends_the_job(running):
    """Last in this module: stops the shared job."""
    job, _, directory = running
    done = _cli("stop", "--checkpoint-dir", directory, "--job", JOB)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"job {JOB} stopped"
    _wait("the job to end", lambda: job.status.status.terminal, 120)
    assert job.status.status in (JobStatus.CANCELED, JobStatus.FINISHED)
    after = _cli("status", "--checkpoint-dir", directory, "--job", JOB)
    assert after.returncode == 1 and "is not running" in after.stderr


def test_the_grafana_dashboard_queries_only_documented_metrics():
    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    documented = set(re.findall(r"^\| `(sparkpoint_\w+)`", (REPO / "docs" / "operations.md").read_text(), re.M))
    queried = {re.sub(r"_(bucket|sum|count)$", "", name)
               for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"sparkpoint_\w+", target["expr"])}
    assert queried and queried <= documented, sorted(queried - documented)
