"""A real Spark standalone cluster (master + 2 one-core workers) per test module.

Each worker has a private tmpfs at the same absolute path (`cluster.state_path`): the
executor's own local disk, invisible to the driver and to the other worker. See
tests/servers/spark_cluster.py. Run with `pytest tests/cluster` (or `-m cluster`).
"""

from __future__ import annotations

import shutil
import sys

import pytest

from tests.servers.spark_cluster import StandaloneCluster, spark_conf


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
        pytest.skip("the cluster harness needs Linux and `unshare` (per-worker mount namespaces)")
    root = tmp_path_factory.mktemp("cluster")
    c = StandaloneCluster(root, workers=2, state_path=root / "executor-state")
    c.start()
    try:
        yield c
    finally:
        c.stop()


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
