"""A real Spark standalone cluster (master + 2 one-core workers) that the cluster tests
share: a cluster costs a master's and two workers' JVM starts. Every test begins with
both workers up (`_all_workers_alive` replaces one an earlier test killed).

Each worker has a private tmpfs at the same absolute path (`cluster.state_path`): the
executor's own local disk, invisible to the driver and to the other worker. See
tests/servers/spark_cluster.py. Run with `pytest tests/cluster` (or `-m cluster`).
"""

from __future__ import annotations

import shutil
import sys

import pytest

from tests.servers.spark_cluster import StandaloneCluster, spark_conf


# The cluster the tests under tests/cluster share; started by the first test that asks for
# it and stopped once a test that needs none follows (or the run ends), so its JVMs do not
# idle through the rest of the run.
_running: list[StandaloneCluster] = []


@pytest.fixture
def cluster(tmp_path_factory):
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        pytest.skip("the cluster harness needs Linux and `unshare` (per-worker mount namespaces)")
    if not _running:
        root = tmp_path_factory.mktemp("cluster")
        _running.append(StandaloneCluster(root, workers=2, state_path=root / "executor-state").start())
    return _running[0]


def _stop_cluster() -> None:
    while _running:
        _running.pop().stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # the test's own fixtures are torn down first: they may still use the cluster
    if _running and (nextitem is None or "cluster" not in getattr(nextitem, "fixturenames", ())):
        _stop_cluster()


def pytest_sessionfinish(session, exitstatus):
    _stop_cluster()


@pytest.fixture(autouse=True)
def _all_workers_alive(request):
    """Every test starts with all workers up: one killed by an earlier test is replaced
    (a fresh worker with an empty local disk)."""
    if "cluster" in request.fixturenames:
        c = request.getfixturevalue("cluster")
        for i, pid in enumerate(c.worker_pids):
            if pid is None:
                c.start_worker(i)


@pytest.fixture
def spark_defaults_dir(cluster, tmp_path):
    """A SPARK_CONF_DIR whose spark-defaults.conf sizes jobs for the small cluster, so the
    commands under test stay exactly as the docs write them."""
    conf = tmp_path / "spark-conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in spark_conf(cluster).items()))
    return conf
