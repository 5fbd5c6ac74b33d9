"""The cluster harness itself: each executor's state directory is private to its worker
(the driver and the other worker see nothing of it), and kill_worker leaves nothing of
that worker alive while the other one keeps running jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.harness import Proc
from tests.servers.spark_cluster import spark_conf

pytestmark = pytest.mark.cluster

# A driver in its own process (like `sparkpoint run`): one barrier stage of 2 tasks, which
# Spark must run at the same time, i.e. one on each 1-core executor. Each task writes a file
# into the state path, waits for the other to have written, then lists the directory.
PROBE_DRIVER = r'''
import json, os, socket, sys
from pyspark import BarrierTaskContext
from pyspark.sql import SparkSession

master, state, conf = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
builder = (SparkSession.builder.master(master).appName("cluster-probe")
           .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
           .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1"))
for k, v in conf.items():
    builder = builder.config(k, v)
spark = builder.getOrCreate()
sc = spark.sparkContext
sc.setLogLevel("ERROR")


def probe(_):
    ctx = BarrierTaskContext.get()
    me = f"task{ctx.partitionId()}-pid{os.getpid()}"
    with open(os.path.join(state, me), "w") as f:
        f.write(me)
    ctx.barrier()  # every task has written its file
    seen = sorted(os.listdir(state))
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    fstype = [m[m.index("-") + 1] for m in mounts if m[4] == state]
    ctx.barrier()
    yield {"partition": ctx.partitionId(), "pid": os.getpid(), "host": socket.gethostname(), "cwd": os.getcwd(),
           "file": me, "seen": seen, "fstype": fstype, "mode": oct(os.stat(state).st_mode & 0o777)}


res = sc.parallelize(range(2), 2).barrier().mapPartitions(probe).collect()
print("PROBE " + json.dumps(res), flush=True)
sys.stdin.readline()  # the test kills a worker meanwhile
after = sc.parallelize(range(4), 4).map(lambda _: (os.getcwd(), os.getpid())).collect()
print("AFTER " + json.dumps(after), flush=True)
spark.stop()
print("DONE", flush=True)
'''


def _start_driver(cluster, tmp_path: Path) -> Proc:
    script = tmp_path / "probe_driver.py"
    script.write_text(PROBE_DRIVER)
    env = dict(cluster.env(), PYTHONUNBUFFERED="1")
    popen = subprocess.Popen([sys.executable, str(script), cluster.master_url, str(cluster.state_path),
                              json.dumps(spark_conf(cluster))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             cwd=tmp_path, env=env, start_new_session=True)
    return Proc(popen)


def _worker_of(cluster, cwd: str) -> int:
    for i in range(cluster.n_workers):
        if Path(cwd).is_relative_to(cluster.worker_dir(i)):
            return i
    raise AssertionError(f"task ran in {cwd}, outside every worker's work dir")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _assert_private_state_dirs(cluster, tmp_path: Path, tasks: list[dict]) -> None:
    assert len(tasks) == 2
    workers = {_worker_of(cluster, t["cwd"]) for t in tasks}
    assert workers == {0, 1}, f"the two tasks must run on different workers: {tasks}"
    probes = {t["file"] for t in tasks}
    for t in tasks:
        # Each task sees its own probe file and not the other's: the other worker's file
        # (written before the barrier) is in another mount namespace. (The disk may hold
        # state of jobs that earlier tests ran on this worker: the cluster is the run's.)
        assert probes & set(t["seen"]) == {t["file"]}, t
        assert t["fstype"] == ["tmpfs"], t
        assert t["mode"] == "0o700", t
    # The driver (and this test process) see the plain, empty directory.
    assert list(cluster.state_path.iterdir()) == []
    leaked = [p for p in cluster.root.rglob("*") if p.name in probes] + \
             [p for p in tmp_path.rglob("*") if p.name in probes]
    assert leaked == [], "state files must exist only in the workers' private mounts"


def test_cluster_state_dirs_are_private_and_a_killed_worker_leaves_nothing_alive_while_the_other_runs_jobs(
        cluster, tmp_path):
    """One driver (a driver JVM start is most of the cost): the probe job, then a worker
    killed between two jobs."""
    proc = _start_driver(cluster, tmp_path)
    try:
        m = proc.wait_for(r"^PROBE (.*)$", timeout=180)
        _assert_private_state_dirs(cluster, tmp_path, json.loads(m.group(1)))
        worker_pid = cluster.worker_pids[1]
        before = cluster.processes(1)
        cmdlines = {pid: _cmdline(pid) for pid in before}
        executors = [p for p, c in cmdlines.items() if "CoarseGrainedExecutorBackend" in c]
        pythons = [p for p, c in cmdlines.items() if "pyspark.daemon" in c or "pyspark/daemon" in c]
        assert worker_pid in before
        assert executors, f"worker 1 runs no executor: {cmdlines}"
        assert pythons, f"worker 1's executor runs no Python worker: {cmdlines}"

        killed = cluster.kill_worker(1)
        assert set(before) <= set(killed)
        survivors = [p for p in before if _alive(p)]
        assert survivors == [], {p: cmdlines[p] for p in survivors}
        assert cluster.worker_pids[1] is None and cluster.processes(1) == []
        assert cluster.worker_pids[0] is not None and _alive(cluster.worker_pids[0])

        proc.popen.stdin.write("go\n")
        proc.popen.stdin.flush()
        m = proc.wait_for(r"^AFTER (.*)$", timeout=180)
        after = json.loads(m.group(1))
        assert len(after) == 4
        assert {_worker_of(cluster, cwd) for cwd, _ in after} == {0}
        proc.wait_for(r"^DONE$", timeout=60)
    finally:
        proc.kill9()
    assert not any(_alive(p) for p in before)
