"""What a job says at start when it cannot run over Spark Connect, and how it reads
observed metrics of either kind of session without ever waiting on them. No Spark:
the sessions and observations here are stand-ins with the attributes pyspark's have."""

from __future__ import annotations

import sys

import pytest

import sparkpoint
from sparkpoint.errors import ConfigError
from sparkpoint.runtime import connect
from sparkpoint.runtime.connect import check_server_runs_sparkpoint, connect_session, is_connect, observed


class _Future:
    def __init__(self, done: bool):
        self.done = done

    def isCompleted(self) -> bool:  # noqa: N802 - py4j's name
        return self.done


class _JavaObservation:
    def __init__(self, done: bool):
        self._future = _Future(done)

    def future(self) -> _Future:
        return self._future


class ClassicObservation:
    """pyspark.sql.Observation's shape: a JVM object whose `get` blocks until an action ran."""

    def __init__(self, done: bool, metrics: dict):
        self._jo = _JavaObservation(done)
        self._metrics = metrics

    @property
    def get(self) -> dict:
        if not self._jo.future().isCompleted():
            raise AssertionError("get would block forever")
        return self._metrics


class ConnectObservation:
    """pyspark.sql.connect.observation.Observation's shape: `get` is {} until an action's
    response carried the metrics."""

    def __init__(self, metrics: dict):
        self.get = metrics


def test_observed_metrics_of_a_classic_session_are_read_only_once_an_action_ran_them():
    assert observed(ClassicObservation(False, {})) is None
    assert observed(ClassicObservation(True, {"n": 7})) == {"n": 7}


def test_observed_metrics_of_a_connect_session_are_none_until_an_action_ran_them():
    assert observed(ConnectObservation({})) is None
    assert observed(ConnectObservation({"n": 7, "max_ts": 12})) == {"n": 7, "max_ts": 12}


def test_a_session_is_connect_by_its_class_not_by_a_process_wide_flag(monkeypatch):
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    classic = type("SparkSession", (), {"__module__": "pyspark.sql.session"})()
    remote = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})()
    assert not is_connect(classic) and is_connect(remote)


def test_a_remote_that_is_not_a_connect_url_is_one_line_naming_the_form():
    with pytest.raises(ConfigError, match=r"spark.remote='spark://h:7077' is not a Spark Connect URL; use sc://"):
        connect_session("spark://h:7077", 2)


def test_a_remote_without_the_connect_client_says_what_to_install(monkeypatch):
    import types

    def missing() -> None:
        raise ImportError("grpcio >= 1.48.1 must be installed; however, it was not found.")

    monkeypatch.setitem(sys.modules, "pyspark.sql.connect.utils",
                        types.SimpleNamespace(check_dependencies=missing))
    with pytest.raises(ConfigError) as e:
        connect_session("sc://127.0.0.1:15002", 2)
    assert "\n" not in str(e.value)
    assert "needs the Spark Connect client" in str(e.value) and "pip install 'pyspark[connect]'" in str(e.value)


class _Frame:
    """Runs a mapInArrow function here, as the server's Python worker would."""

    def __init__(self, hide_sparkpoint: bool = False, fail: Exception | None = None):
        self.hide_sparkpoint, self.fail, self.fn = hide_sparkpoint, fail, None

    def mapInArrow(self, fn, schema):  # noqa: N802 - pyspark's name
        self.fn = fn
        return self

    def collect(self) -> list[dict]:
        if self.fail is not None:
            raise self.fail
        saved = {k: v for k, v in sys.modules.items() if k == "sparkpoint" or k.startswith("sparkpoint.")}
        if self.hide_sparkpoint:
            sys.modules["sparkpoint"] = None  # `import sparkpoint` raises ImportError
        try:
            return [row for batch in self.fn(iter([])) for row in batch.to_pylist()]
        finally:
            sys.modules.update(saved)


class _Session:
    def __init__(self, frame: _Frame):
        self.frame = frame

    def range(self, *args):
        return self.frame


def test_a_server_whose_python_lacks_sparkpoint_stops_the_job_at_start_with_one_line():
    with pytest.raises(ConfigError) as e:
        check_server_runs_sparkpoint(_Session(_Frame(hide_sparkpoint=True)))
    text = str(e.value)
    assert "\n" not in text
    assert "the Spark Connect server's Python workers cannot import sparkpoint" in text
    assert f"install sparkpoint=={sparkpoint.__version__} in the server's Python environment" in text


def test_a_server_that_cannot_run_python_steps_stops_the_job_at_start_with_one_line():
    failure = RuntimeError("[PYTHON_WORKER] Cannot run program \"python3\": error=2\n  at java.lang...")
    with pytest.raises(ConfigError, match=r"^the Spark Connect server could not run a Python step "
                                          r"\(RuntimeError: \[PYTHON_WORKER\] Cannot run program"):
        check_server_runs_sparkpoint(_Session(_Frame(fail=failure)))


def test_a_server_with_sparkpoint_passes_the_check():
    check_server_runs_sparkpoint(_Session(_Frame()))


def test_a_server_with_another_sparkpoint_version_is_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(sparkpoint, "__version__", "0.0.1-driver")
    frame = _Frame()
    real_collect = frame.collect

    def collect_as_server():
        monkeypatch.setattr(sparkpoint, "__version__", "0.0.2-server")
        try:
            return real_collect()
        finally:
            monkeypatch.setattr(sparkpoint, "__version__", "0.0.1-driver")

    frame.collect = collect_as_server
    with caplog.at_level("WARNING", logger=connect.__name__):
        check_server_runs_sparkpoint(_Session(frame))
    assert [r.getMessage() for r in caplog.records] == [
        "the Spark Connect server's Python workers run sparkpoint 0.0.2-server, this driver 0.0.1-driver: "
        "install the same version on both"]


def test_a_connect_urls_token_is_never_shown():
    from sparkpoint.redaction import MASK, mask_url, masked

    url = "sc://workspace.example:443/;token=dapi-SECRET;x-databricks-cluster-id=0123;use_ssl=true"
    shown = f"sc://workspace.example:443/;token={MASK};x-databricks-cluster-id=0123;use_ssl=true"
    assert mask_url(url) == shown
    assert masked("spark.remote", url) == shown


def test_a_bad_remote_is_refused_without_showing_its_token():
    with pytest.raises(ConfigError) as e:
        connect_session("grpc://workspace.example:443/;token=dapi-SECRET", 2)
    assert "dapi-SECRET" not in str(e.value)
