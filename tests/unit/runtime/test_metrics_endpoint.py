"""What Prometheus sees of a job: /metrics of a real job's server (set up without Spark),
its labels, who may scrape it, where it listens, and the alert rules shipped beside the
Grafana dashboard (docs/prometheus-alerts.yml)."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from sparkpoint import GeneratorSource, KeyedAggregate, Pipeline
from sparkpoint.config import Settings
from sparkpoint.connectors.parquet_sink import ParquetSink
from sparkpoint.errors import ConfigError
from sparkpoint.runtime.jobmaster import JobMaster

REPO = Path(__file__).resolve().parents[3]
ALERTS = REPO / "docs" / "prometheus-alerts.yml"
JOB = "orders"
TOKEN = "rest-token-for-the-api"


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _get(url: str, headers: dict | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def served(tmp_path):
    """A job set up as `run` does (lease, coordinator, REST server, metrics port), with a
    token on its API and /metrics also on a port of its own at 127.0.0.2."""
    metrics_port = _free_port("127.0.0.2")
    pipeline = (Pipeline(JOB).source(GeneratorSource("g", keys=10, total_events=10))
                .stateful(KeyedAggregate("agg", ["key"], "value", value_type="bigint"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    settings = Settings.load(overrides={
        "pipeline.name": JOB, "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "sparkpoint.progress": False, "rest.port": 0,
        "rest.token": TOKEN, "metrics.prometheus.port": metrics_port,
        "metrics.prometheus.bind-address": "127.0.0.2"})
    job = JobMaster(pipeline, settings, spark=object())  # nothing here runs a Spark job
    try:
        job._setup()
        yield job, job.rest.address, f"http://127.0.0.2:{metrics_port}"
    finally:
        job._teardown()


def _exported_names(text: str) -> set[str]:
    """Every series name /metrics can carry: a family's TYPE line names it without the
    suffixes a counter (_total) or histogram (_bucket, _sum, _count) adds."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\w+) (\w+)$", text, re.M):
        names.add(name)
        if kind == "counter":
            names.add(f"{name}_total")
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def test_every_series_carries_job_name_and_none_the_job_label_prometheus_sets_on_scrape(served) -> None:
    _, base, _ = served
    status, text = _get(f"{base}/metrics")
    assert status == 200
    series = [line for line in text.splitlines() if line.startswith("sparkpoint_") and "{" in line]
    assert any(line.startswith(f'sparkpoint_checkpoints_triggered_total{{job_name="{JOB}"}}') for line in series)
    assert any(line.startswith(f'sparkpoint_job_status{{job_name="{JOB}",status=') for line in series)
    clashing = [line for line in series if re.search(r'[{,]job="', line)]
    assert clashing == [], f"series with a `job` label (Prometheus overwrites it on scrape): {clashing[:3]}"


def test_metrics_need_no_token_while_the_rest_api_does(served) -> None:
    _, base, metrics = served
    assert _get(f"{base}/jobs/overview")[0] == 401
    assert _get(f"{base}/jobs/overview", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    for url in (f"{base}/metrics", f"{metrics}/metrics"):
        status, text = _get(url)
        assert status == 200 and "sparkpoint_checkpoints_triggered_total" in text, url
        assert TOKEN not in text


def test_the_metrics_port_listens_on_its_bind_address_and_answers_a_scrape_by_any_name(served) -> None:
    """Prometheus addresses a target by whatever name its service discovery gives
    (a Kubernetes service, a DNS name): the metrics port answers it; nothing else is
    served there."""
    _, _, metrics = served
    port = int(metrics.rsplit(":", 1)[1])
    status, _ = _get(f"{metrics}/metrics", {"Host": f"orders-metrics.monitoring.svc:{port}"})
    assert status == 200
    assert _get(f"{metrics}/jobs/overview")[0] == 404
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)  # bound to 127.0.0.2 only


def test_a_metrics_bind_address_without_a_metrics_port_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"^metrics.prometheus.bind-address=0.0.0.0 needs metrics.prometheus.port "
                                          r"too \(the port Prometheus scrapes /metrics on\)$"):
        Settings.load(overrides={"metrics.prometheus.bind-address": "0.0.0.0"})
    settings = Settings.load(overrides={"metrics.prometheus.bind-address": "0.0.0.0", "metrics.prometheus.port": 9249})
    assert (settings.metrics_bind_address, settings.metrics_port) == ("0.0.0.0", 9249)
    assert Settings.load().metrics_bind_address == "127.0.0.1"


def _rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_the_alert_rules_are_valid_prometheus_rule_groups() -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    assert set(doc) == {"groups"} and doc["groups"]
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["name"] and group["rules"], group
    alerts = {rule["alert"]: rule for rule in _rules()}
    assert len(alerts) == len(_rules()), "alert names are unique"
    for name, rule in alerts.items():
        assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}, name
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert "{{ $labels." in rule["annotations"]["summary"], f"{name}: the summary names which job or group"
    covered = " ".join(rule["expr"] for rule in alerts.values())
    for what in ("sparkpoint_checkpoint_failures_total", "sparkpoint_restarts_total",
                 "sparkpoint_source_lag_records"):
        assert what in covered, f"no alert on {what}"
    promtool = shutil.which("promtool")
    if promtool:  # Prometheus's own parser, where it is installed (Debian: the prometheus package)
        done = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_every_metric_the_alert_rules_use_is_one_the_job_exports(served) -> None:
    _, base, _ = served
    exported = _exported_names(_get(f"{base}/metrics")[1])
    used = {name for rule in _rules() for name in re.findall(r"\b(sparkpoint_\w+)", rule["expr"])}
    assert used, "the rules use sparkpoint's metrics"
    assert used <= exported, f"the alert rules use metrics /metrics does not have: {sorted(used - exported)}"
    labels = {label for rule in _rules() for label in re.findall(r"\b(\w+)\s*(?:=~?|!=)\s*\"", rule["expr"])}
    assert "job" not in labels, "the job label is the scrape job's, not sparkpoint's"


def test_the_grafana_dashboard_selects_the_job_by_job_name(served) -> None:
    """Under Prometheus's default `honor_labels: false` a target's own `job` label is
    renamed `exported_job`, and a selector on `job` finds the scrape job instead."""
    import json

    dashboard = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "job")
    assert variable["query"]["query"] == "label_values(sparkpoint_job_status, job_name)"
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert not [e for e in exprs if re.search(r'[{,\s]job\s*=', e)]
    per_job = [e for e in exprs if not re.search(r"sparkpoint_(kafka|source_malformed)_", e)]  # by group / source
    assert per_job and all('job_name="$job"' in e for e in per_job), [e for e in per_job if 'job_name="$job"' not in e]
    _, base, _ = served
    exported = _exported_names(_get(f"{base}/metrics")[1])
    queried = {name for expr in exprs for name in re.findall(r"\b(sparkpoint_\w+)", expr)}
    assert queried <= exported, sorted(queried - exported)
