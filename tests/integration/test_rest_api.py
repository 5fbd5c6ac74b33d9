"""The REST API, the CLI over it and /metrics, against a real running job on local Spark."""

from __future__ import annotations

import json
import os
import re
import stat
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
SECRET = "s3-secret-do-not-show"


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


def _control(job) -> dict:
    """The headers the CLI sends: the job's control token (from its 0600 file) and JSON."""
    from sparkpoint.runtime.rest.security import read_control_token

    return {"Authorization": f"Bearer {read_control_token(job.run_id)}", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def running(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("rest")
    # The job's user-private runtime directory, where it keeps its control token.
    previous_runtime_dir = os.environ.get("SPARKPOINT_RUNTIME_DIR")
    os.environ["SPARKPOINT_RUNTIME_DIR"] = str(root / "run")
    pipeline = (Pipeline(JOB)
                .source(GeneratorSource("events", keys=50, total_events=50_000_000, max_records_per_epoch=2_000, splits=2))
                .watermark("ts", "1 s")
                .stateful(KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
                .sink(ParquetSink(str(root / "out"))))
    settings = Settings.load(overrides={
        "pipeline.name": JOB, "execution.checkpointing.dir": str(root / "chk"),
        "state.local.dir": str(root / "state"), "execution.checkpointing.interval": "700 ms",
        "sparkpoint.progress": False, "rest.port": 0, "restart-strategy.type": "none",
        "spark.conf": {"spark.hadoop.fs.s3a.secret.key": SECRET, "spark.hadoop.fs.s3a.access.key": "AKIAEXAMPLE"},
        "execution.checkpointing.savepoint.allowed-targets": [str(root / "savepoints")]})
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
    if previous_runtime_dir is None:
        os.environ.pop("SPARKPOINT_RUNTIME_DIR", None)
    else:
        os.environ["SPARKPOINT_RUNTIME_DIR"] = previous_runtime_dir
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
        status, answer = _request(base + path, method, body, _control(running[0]))
        assert status == expected, (method, path, status, answer)
        assert isinstance(answer, dict) and answer["errors"] and isinstance(answer["errors"][0], str)


def test_trigger_a_checkpoint_and_follow_the_request(running):
    job, base, _ = running
    status, body = _request(f"{base}/jobs/{JOB}/checkpoints", "POST", b"", _control(job))
    assert status == 202
    url = f"{base}/jobs/{JOB}/checkpoints/{body['request-id']}"
    answer = _wait("the triggered checkpoint", lambda: (a := _request(url)[1])["status"]["id"] == "COMPLETED" and a)
    checkpoint_id = answer["operation"]["checkpointId"]
    history = _request(f"{base}/jobs/{JOB}/checkpoints")[1]["history"]
    assert any(h["id"] == checkpoint_id and h["status"] == "COMPLETED" for h in history)


def test_savepoint_request(running):
    job, base, directory = running
    target = Path(directory).parent / "savepoints" / "sp"
    status, body = _request(f"{base}/jobs/{JOB}/savepoints", "POST",
                            json.dumps({"target-directory": str(target)}).encode(), _control(job))
    assert status == 202
    url = f"{base}/jobs/{JOB}/savepoints/{body['request-id']}"
    answer = _wait("the savepoint", lambda: (a := _request(url)[1])["status"]["id"] == "COMPLETED" and a)
    assert "failure-cause" not in answer["operation"], answer
    assert answer["operation"]["location"] == str(target)
    assert (target / "_metadata").exists()
    # The copy of the job's state is not readable by other users of the machine.
    assert stat.S_IMODE(target.stat().st_mode) & 0o077 == 0, oct(target.stat().st_mode)


def test_a_post_without_the_control_token_is_refused(running):
    job, base, _ = running
    for headers in ({"Content-Type": "application/json"},
                    {"Content-Type": "application/json", "Authorization": "Bearer not-the-token"}):
        status, answer = _request(f"{base}/jobs/{JOB}/checkpoints", "POST", b"{}", headers)
        assert status == 401 and "token" in answer["errors"][0], (status, answer)
    status, answer = _request(f"{base}/jobs/{JOB}/stop", "POST", b"{}", {"Content-Type": "application/json"})
    assert status == 401, answer
    assert not job.status.status.terminal and job.savepoints.requests.empty()


def test_the_control_token_is_in_a_file_only_the_job_user_can_read(running):
    from sparkpoint.runtime.rest.security import control_token_path

    job, _, _ = running
    path = control_token_path(job.run_id)
    assert path.parent == Path(os.environ["SPARKPOINT_RUNTIME_DIR"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.getuid()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(path.read_text().strip()) >= 32


def test_a_post_that_is_not_json_is_refused(running):
    job, base, _ = running
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {**_control(job)}
        if content_type:
            headers["Content-Type"] = content_type
        else:
            del headers["Content-Type"]
        status, answer = _request(f"{base}/jobs/{JOB}/stop", "POST", b'{"drain": false}', headers)
        assert status == 415 and "application/json" in answer["errors"][0], (content_type, status, answer)
    assert not job.status.status.terminal and job.savepoints.requests.empty()


def test_a_request_for_another_host_name_is_refused(running):
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1."""
    job, base, _ = running
    port = base.rsplit(":", 1)[1]
    for method, path, body in (("GET", f"/jobs/{JOB}/config", None), ("GET", "/jobs/overview", None),
                               ("POST", f"/jobs/{JOB}/checkpoints", b"{}")):
        status, answer = _request(base + path, method, body, {**_control(job), "Host": f"evil.example:{port}"})
        assert status == 403 and "Host" in answer["errors"][0], (path, status, answer)
    status, _ = _request(base + "/jobs/overview", headers={"Host": f"localhost:{port}"})
    assert status == 200


def test_a_cross_origin_post_is_refused(running):
    job, base, _ = running
    for origin in ("http://127.0.0.1:1", "http://evil.example", "null"):
        status, answer = _request(f"{base}/jobs/{JOB}/checkpoints", "POST", b"{}", {**_control(job), "Origin": origin})
        assert status == 403 and "Origin" in answer["errors"][0], (origin, status, answer)
    status, answer = _request(f"{base}/jobs/{JOB}/checkpoints", "POST", b"{}", {**_control(job), "Origin": base})
    assert status == 202, answer


def test_a_savepoint_outside_the_checkpoint_storage_is_refused(running, tmp_path):
    job, base, directory = running
    for target in ("http://127.0.0.1:1/steal", str(tmp_path / "elsewhere"), f"{directory}/../../outside",
                   "memory://x/y"):
        for path, body in (("savepoints", {"target-directory": target}),
                           ("stop", {"savepoint": True, "target-directory": target})):
            status, answer = _request(f"{base}/jobs/{JOB}/{path}", "POST", json.dumps(body).encode(), _control(job))
            assert status == 403 and "allowed-targets" in answer["errors"][0], (target, status, answer)
    assert not (tmp_path / "elsewhere").exists()
    assert not job.status.status.terminal and job.savepoints.requests.empty()


def test_the_config_shows_no_secret(running):
    _, base, _ = running
    config = _request(f"{base}/jobs/{JOB}/config")[1]["execution-config"]
    assert SECRET not in json.dumps(config) and "AKIAEXAMPLE" not in json.dumps(config)
    assert config["spark.conf"]["spark.hadoop.fs.s3a.secret.key"] == "******"
    assert config["spark.conf"]["spark.hadoop.fs.s3a.access.key"] == "******"
    assert config["pipeline.name"] == JOB


def test_a_web_page_from_another_origin_cannot_stop_the_job_or_take_a_savepoint(running, tmp_path):
    """A real browser opens an attacker's page (another port on 127.0.0.1) that POSTs to
    the job: a no-cors fetch with a JSON body, and auto-submitted forms whose text/plain
    body is valid JSON. The job keeps running and no savepoint is written."""
    import http.server

    chromium = _chromium()
    job, base, directory = running
    stolen = Path(directory).parent / "savepoints" / "stolen"
    payload = {"target-directory": str(stolen)}
    page = f"""<!doctype html><html><body>
<form id="f1" method="POST" enctype="text/plain" action="{base}/jobs/{JOB}/savepoints" target="sink1">
  <input name='{{"target-directory": "{stolen}/form' value='"}}'></form>
<form id="f2" method="POST" enctype="text/plain" action="{base}/jobs/{JOB}/stop" target="sink2">
  <input name='{{"drain": "' value='"}}'></form>
<iframe name="sink1"></iframe><iframe name="sink2"></iframe>
<script>
fetch({json.dumps(base + f"/jobs/{JOB}/savepoints")}, {{method: "POST", mode: "no-cors",
      headers: {{"Content-Type": "text/plain"}}, body: {json.dumps(json.dumps(payload))}}});
fetch({json.dumps(base + f"/jobs/{JOB}/stop")}, {{method: "POST", mode: "no-cors", body: "{{}}"}});
fetch({json.dumps(base + f"/jobs/{JOB}/stop")}, {{method: "POST", headers: {{"Content-Type": "application/json"}},
      body: "{{}}"}}).catch(() => {{}});
document.getElementById("f1").submit();
document.getElementById("f2").submit();
</script></body></html>""".encode()
    seen: list[str] = []

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    attacker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    try:
        done = _browser(chromium, tmp_path / "profile", "--virtual-time-budget=5000", "--dump-dom",
                        f"http://127.0.0.1:{attacker.server_address[1]}/")
        assert done.returncode == 0, done.stderr[-2000:]
        assert seen, "the browser did not load the attacker's page"
    finally:
        attacker.shutdown()
        attacker.server_close()
    time.sleep(2)  # a stop would have been queued by now; the main thread serves it within an epoch
    assert not job.status.status.terminal and job.savepoints.requests.empty()
    assert job.status.status == JobStatus.RUNNING
    assert not stolen.exists()


def test_the_dashboard_of_a_job_with_a_token_loads_and_asks_for_it(running, tmp_path):
    job, _, _ = running
    guarded = RestServer(job, "127.0.0.1", 0, token="s3cret")
    try:
        done = _browser(_chromium(), tmp_path / "profile", "--virtual-time-budget=3000", "--dump-dom",
                        f"{guarded.address}/")
    finally:
        guarded.close(linger_s=0)
    assert done.returncode == 0, done.stderr[-2000:]
    html = done.stdout
    assert re.search(r'<form id="login" class="login">', html), html[:2000]  # shown, not hidden
    assert re.search(r'id="error" class="error">cannot reach the job: missing or wrong token', html), html[:3000]


def _chromium() -> str:
    path = Path("/usr/bin/chromium")
    if not path.exists():
        pytest.fail("chromium is not installed at /usr/bin/chromium: `make test` installs it "
                    "(apt-get install chromium)")
    return str(path)


def _browser(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


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
    assert re.search(r'^sparkpoint_records_in_total\{job_name="rest-api"\} [1-9]', text, re.M)
    assert re.search(r'^sparkpoint_checkpoint_size_bytes_count\{job_name="rest-api"\} [1-9]', text, re.M)
    assert re.search(r'^sparkpoint_source_lag_records\{job_name="rest-api",split="0"\}', text, re.M)


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


def test_a_token_in_the_query_string_is_refused(running):
    """A token in a URL ends up in logs, shell history and the browser's history."""
    job, _, _ = running
    guarded = RestServer(job, "127.0.0.1", 0, token="s3cret")
    try:
        status, body = _request(f"{guarded.address}/jobs/overview?token=s3cret")
        assert status == 400 and "Authorization" in body["errors"][0], (status, body)
        status, body = _request(f"{guarded.address}/jobs/{JOB}/checkpoints?token=s3cret", "POST", b"{}",
                                {"Content-Type": "application/json"})
        assert status == 400, (status, body)
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
