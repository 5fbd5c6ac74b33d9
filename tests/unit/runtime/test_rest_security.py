"""Who may steer a job through its REST API: the pure checks behind the server
(tests/integration/test_rest_api.py runs them against the real server)."""

from __future__ import annotations

import os
import stat

import pytest

from sparkpoint.errors import ConfigError
from sparkpoint.redaction import MASK, mask_url, masked
from sparkpoint.runtime.rest import security
from sparkpoint.runtime.savepoints import check_target


@pytest.mark.parametrize("host", ["127.0.0.1:8081", "localhost:8081", "[::1]:8081", "127.0.0.1", "LOCALHOST:1"])
def test_loopback_names_are_this_loopback_server(host):
    assert security.host_allowed(host, "127.0.0.1")


@pytest.mark.parametrize("host", ["evil.example:8081", "evil.example", "10.0.0.5:8081", "127.0.0.1.evil.example",
                                  "", None])
def test_a_rebound_dns_name_is_not_this_loopback_server(host):
    assert not security.host_allowed(host, "127.0.0.1")


def test_a_server_bound_to_another_address_answers_to_it_and_to_this_machines_names():
    import socket

    assert security.host_allowed("10.1.2.3:8081", "10.1.2.3")
    assert security.host_allowed(f"{socket.gethostname()}:8081", "0.0.0.0")
    assert not security.host_allowed("evil.example:8081", "0.0.0.0")


@pytest.mark.parametrize("origin, ok", [
    (None, True), ("http://127.0.0.1:8081", True), ("http://127.0.0.1:9999", False), ("http://evil.example", False),
    ("null", False), ("https://127.0.0.1:8081", False), ("http://localhost:8081", False)])
def test_only_this_servers_own_origin_may_post(origin, ok):
    assert security.same_origin(origin, "127.0.0.1:8081") is ok


def test_the_bearer_token_must_match_exactly():
    assert security.bearer_matches("Bearer abc", "abc")
    assert security.bearer_matches("Bearer abc", None, "xyz", "abc")
    assert not security.bearer_matches("Bearer abcd", "abc")
    assert not security.bearer_matches("abc", "abc")
    assert not security.bearer_matches("Bearer ", "", None)


def test_the_control_token_file_is_readable_by_its_user_only(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o755)
    os.chmod(run_dir, 0o755)
    monkeypatch.setenv(security.RUNTIME_DIR_ENV, str(run_dir))
    token = security.new_control_token()
    path = security.write_control_token("r1", token)
    assert path == run_dir / "rest-r1.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700, "a group/world-readable directory is made private"
    assert security.read_control_token("r1") == token and len(token) >= 32
    security.remove_control_token("r1")
    assert security.read_control_token("r1") is None


def test_a_run_id_from_a_forged_lease_does_not_lead_out_of_the_runtime_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(security.RUNTIME_DIR_ENV, str(tmp_path / "run"))
    (tmp_path / "secret.token").write_text("not the job's")
    for run_id in ("../secret", "../../etc/passwd", "", "a/b"):
        with pytest.raises(ValueError):
            security.control_token_path(run_id)
        assert security.read_control_token(run_id) is None


def test_the_runtime_dir_is_user_private_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv(security.RUNTIME_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert security.runtime_dir() == tmp_path / "sparkpoint"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert security.runtime_dir() == tmp_path / "home" / ".sparkpoint" / "run"


# ------------------------------------------------------------------------ secrets
def test_secret_configuration_values_are_masked_at_any_depth():
    shown = masked("spark.conf", {
        "spark.hadoop.fs.s3a.secret.key": "S", "spark.hadoop.fs.s3a.access.key": "A",
        "spark.hadoop.fs.azure.account.key.acc.blob.core.windows.net": "K", "spark.ssl.keyPassword": "P",
        "kafka.sasl.jaas.config": "org.apache... password=\"p\";", "spark.sql.shuffle.partitions": "4"})
    assert shown == {"spark.hadoop.fs.s3a.secret.key": MASK, "spark.hadoop.fs.s3a.access.key": MASK,
                     "spark.hadoop.fs.azure.account.key.acc.blob.core.windows.net": MASK,
                     "spark.ssl.keyPassword": MASK, "kafka.sasl.jaas.config": MASK,
                     "spark.sql.shuffle.partitions": "4"}
    options = masked("execution.checkpointing.storage-options",
                     {"key": "AK", "secret": "SK", "token": "T", "endpoint_url": "http://127.0.0.1:9000",
                      "client_kwargs": {"aws_secret_access_key": "SK2", "region_name": "x"}})
    assert options == {"key": MASK, "secret": MASK, "token": MASK, "endpoint_url": "http://127.0.0.1:9000",
                       "client_kwargs": {"aws_secret_access_key": MASK, "region_name": "x"}}
    assert masked("rest.token", "t") == MASK and masked("alarms.webhook-url", "https://h/T0K3N") == MASK
    assert masked("rest.token", None) is None and masked("pipeline.name", "orders") == "orders"


def test_credentials_in_urls_are_masked():
    assert mask_url("s3://AKIA:SECRET@bucket/chk") == f"s3://{MASK}@bucket/chk"
    assert mask_url("/jobs/x/config?token=abc&verbose=1") == f"/jobs/x/config?token={MASK}&verbose=1"
    assert "sig" not in mask_url("https://b.s3/x?X-Amz-Signature=sig&X-Amz-Credential=cred")
    assert mask_url("GET /jobs/overview HTTP/1.1") == "GET /jobs/overview HTTP/1.1"


# --------------------------------------------------------------- savepoint targets
def test_a_savepoint_below_the_checkpoint_directory_is_allowed(tmp_path):
    check_target(str(tmp_path / "chk" / "sp-1"), str(tmp_path / "chk"), [])
    check_target(f"file://{tmp_path}/chk/sp-2", str(tmp_path / "chk"), [])
    check_target("s3://bucket/chk/savepoints/1", "s3://bucket/chk", [])
    check_target("s3://bucket/sp/1", "s3://bucket/chk", ["s3://bucket/sp"])
    check_target(str(tmp_path / "backups" / "x"), str(tmp_path / "chk"), [str(tmp_path / "backups")])


@pytest.mark.parametrize("target", [
    "http://127.0.0.1:1/steal", "https://evil.example/x", "memory://x/y", "s3://other-bucket/chk/x",
    "s3://bucket/chk/../elsewhere", "s3://bucket/chkother", "s3://bucket/chk/x?versionId=1",
    "/tmp/elsewhere", "{chk}/../outside", "{chk}-sibling", "{link}/x"])
def test_a_savepoint_anywhere_else_is_refused(tmp_path, target):
    chk = tmp_path / "chk"
    chk.mkdir()
    (chk / "link").symlink_to(tmp_path)  # a link inside the directory that leads out of it
    root = f"s3://bucket/chk" if target.startswith("s3://") else str(chk)
    with pytest.raises(ConfigError, match="allowed-targets"):
        check_target(target.format(chk=chk, link=chk / "link"), root, [])


def test_the_exceptions_view_shows_no_credentials_of_a_failure_or_an_alarm() -> None:
    from types import SimpleNamespace

    from sparkpoint.checkpoint.alarms import CheckpointFailureEvent
    from sparkpoint.checkpoint.reasons import CheckpointFailureReason
    from sparkpoint.runtime.rest.observer import JobObserver
    from sparkpoint.runtime.status import JobStatus

    listeners: list = []
    alarms: list = []
    job = SimpleNamespace(epoch=3, status=SimpleNamespace(add_listener=listeners.append),
                          coordinator=SimpleNamespace(alarms=SimpleNamespace(
                              register=lambda f: alarms.append(f) or (lambda: None))))
    observer = JobObserver(job)
    secret_url = "s3://AKIAEXAMPLE:wJalrSECRETKEY@bucket/chk/_metadata"
    listeners[0](JobStatus.RUNNING, JobStatus.FAILING, OSError(f"cannot read {secret_url}"))
    alarms[0](CheckpointFailureEvent(
        job_name="j", checkpoint_id=4, reason=CheckpointFailureReason.IO_EXCEPTION, participant=None,
        error_summary=f"StorageError: write of {secret_url} failed", counted=True,
        consecutive_failures=1, threshold=10, timestamp_ms=0))
    shown = str(observer.exceptions())
    assert "wJalrSECRETKEY" not in shown and "AKIAEXAMPLE" not in shown
    assert "bucket/chk/_metadata" in shown  # still says which file
