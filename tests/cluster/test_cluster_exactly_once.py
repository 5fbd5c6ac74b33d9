"""Run on a real Spark cluster.

The job runs through the public CLI (`python -m sparkpoint.ops.cli run ...`) as a client-mode
driver against a standalone master with two 1-core workers. `state.local.dir` is the workers'
private state path (each executor's own local disk); the checkpoint and output directories
are on the file system every process shares, like a shared FS. The committed output must
equal, row for row, the updates the input alone gives (tests/e2e/chaos_oracles.py;
update-mode rows included: epoch boundaries are a pure function of the sources'
positions) when the driver is SIGKILLed and the same command is run again; a join graph
with a worker killed mid-run must equal pandas (the last test); and the docs' commands
below, where nothing fails, must equal pandas too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest

from tests.e2e.chaos_oracles import aggregate_updates, as_canonical
from tests.e2e.harness import AGGREGATE_PIPELINE, REPO, Job, Proc, canonical
from tests.servers.spark_cluster import spark_settings

pytestmark = pytest.mark.cluster

KEYS = 2_000
TOTAL = 200_000
PER_EPOCH = 10_000  # ~20 epochs: on the cluster a run takes 20 s and more (JVM start-ups included)
COMPLETED = r"completed checkpoint (\d+) of job"


def _job(root, name: str, sets: list[str] | None = None) -> Job:
    return Job(root, name=name, template=AGGREGATE_PIPELINE, keys=KEYS, total=TOTAL, per_epoch=PER_EPOCH,
               sets=list(sets or []))


def _cluster_job(cluster, root, name: str) -> Job:
    return _job(root, name, [*spark_settings(cluster), f"state.local.dir={cluster.state_path}"])


def _completed_checkpoints(proc: Proc) -> int:
    m = re.search(r"(\d+) checkpoints completed", proc.text)
    assert m, proc.text[-3000:]
    return int(m.group(1))


def _wait_checkpoints(proc: Proc, n: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while proc.count(COMPLETED) < n:
        if proc.popen.poll() is not None:
            raise AssertionError(f"the job exited ({proc.popen.returncode}) before {n} checkpoints completed:\n"
                                 + proc.text[-4000:])
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {n} checkpoints completed in {timeout:.0f}s:\n" + proc.text[-4000:])
        time.sleep(0.2)


def _save(proc: Proc, path) -> None:
    """Keep the driver's output next to the job (pytest's tmp dirs) for a post-mortem."""
    path.write_text(proc.text)


def _finished(proc: Proc) -> None:
    assert proc.popen.returncode == 0, proc.text[-4000:]
    assert "FINISHED" in proc.text, proc.text[-4000:]


@pytest.fixture
def driver_state_view(cluster):
    """What the driver sees at the workers' state path must stay the plain empty directory:
    the driver never writes state locally. Cleared afterwards so tests stay independent."""
    assert list(cluster.state_path.iterdir()) == [], "the driver's view of the state path must start empty"
    yield
    for p in cluster.state_path.iterdir():
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def _job_state(cluster, worker: int, job: str) -> list[str]:
    """The job's files on worker `worker`'s own disk (`state.local.dir/<job>-<hash of its
    checkpoint location>/...`)."""
    return [f for f in cluster.state_files(worker) if f.split("/", 1)[0].rsplit("-", 1)[0] == job]


def _assert_driver_wrote_no_state(cluster) -> None:
    found = sorted(str(p.relative_to(cluster.state_path)) for p in cluster.state_path.rglob("*"))
    assert found == [], f"the driver wrote state into its own {cluster.state_path}: {found[:20]}"


@pytest.fixture(scope="module")
def reference() -> list[tuple]:
    """What every correct run commits, computed from the generator's input (no
    failure-free run on local[2]: that was a Spark start of its own)."""
    rows = as_canonical(aggregate_updates(TOTAL, keys=KEYS, per_epoch=PER_EPOCH),
                        ["key", "count", "sum", "min", "max", "epoch"])
    assert len(rows) > KEYS
    return rows


def _run_killing_a_worker(cluster, job: Job, tmp_path):
    """Run `job` to its end, killing worker 1 once two checkpoints completed; the driver's
    process and the index of its first line after the kill."""
    proc = job.start()
    try:
        _wait_checkpoints(proc, 2)
        assert proc.popen.poll() is None, "the job finished before the worker could be killed:\n" + proc.text[-3000:]
        cluster.kill_worker(1)
        before_kill = len(proc.lines)
        proc.wait(timeout=300)
    finally:
        proc.kill9()
        _save(proc, tmp_path / "driver.log")
    _finished(proc)
    return proc, before_kill


def test_cluster_driver_killed_rerun_resumes_exactly_once(cluster, reference, tmp_path, driver_state_view):
    job = _cluster_job(cluster, tmp_path / "job", "cluster_c")
    first = job.start()
    try:
        _wait_checkpoints(first, 2)
        assert first.popen.poll() is None, "the job finished before the driver could be killed:\n" + first.text[-3000:]
    finally:
        first.kill9()  # the driver's whole process group: its JVM dies with it
        _save(first, tmp_path / "driver-killed.log")
    second = job.run(timeout=300)
    _save(second, tmp_path / "driver-rerun.log")
    _finished(second)
    assert "resuming from checkpoint" in second.text or "restores checkpoint" in second.text, second.text[-3000:]
    assert canonical(job.output(), drop=()) == reference
    _assert_driver_wrote_no_state(cluster)


# ---------------------------------------------------------------- docs/deploy.md, as written
DEPLOY_DOC = REPO / "docs" / "deploy.md"
CLICKS_JOB = "clicks-per-minute"
T0 = datetime(2024, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def deploy_block(name: str) -> str:
    m = re.search(rf"^<!-- deploy-test: {name} -->\n```\w+\n(.*?)^```", DEPLOY_DOC.read_text(), re.S | re.M)
    assert m, f"docs/deploy.md has no block marked deploy-test: {name}"
    return m.group(1)


def _clicks(n: int = 1_200) -> pd.DataFrame:
    return pd.DataFrame([{"key": i % 11, "t": T0 + timedelta(seconds=i * 0.7 + (-1) ** i * (i % 5) * 0.3)}
                         for i in range(n)])


class DeployDocRun:
    """One of docs/deploy.md's command blocks in a fresh directory holding the docs' pipeline
    file, `.venv` (this venv) and the input; only the master URL and the /shared and
    /mnt/local-ssd paths are pointed at the test's cluster and directories."""

    def __init__(self, cluster, root, spark_defaults_dir):
        self.root, self.cluster = root, cluster
        self.shared = root / "shared"
        (root / ".venv").symlink_to(sys.prefix)
        (root / "clicks_job.py").write_text(self._placed(deploy_block("pipeline")))
        self.events = _clicks()
        inbox = self.shared / "clicks"
        inbox.mkdir(parents=True)
        for f, start in enumerate(range(0, len(self.events), 300)):
            rows = self.events.iloc[start:start + 300]
            (inbox / f"part-{f:03d}.json").write_text(
                "".join(json.dumps({"key": int(r.key), "ts": r.t.isoformat()}) + "\n" for r in rows.itertuples()))
        # A user who did not activate the venv: its bin is not on PATH.
        path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                               if Path(p).resolve() != Path(sys.prefix, "bin").resolve())
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("PYSPARK_", "SPARK_", "SPARKPOINT_", "VIRTUAL_ENV"))}
        self.env.update(PATH=path, SPARK_CONF_DIR=str(spark_defaults_dir), SPARKPOINT_REST_PORT="0",
                        PYTHONUNBUFFERED="1")

    def _placed(self, text: str) -> str:
        return (text.replace("spark://master-host:7077", self.cluster.master_url)
                .replace("/mnt/local-ssd/sparkpoint", str(self.cluster.state_path))
                .replace("/shared/", f"{self.shared}/"))

    def run(self, block: str, timeout: float = 400) -> Proc:
        script = self.root / f"{block}.sh"
        script.write_text("set -e\n" + self._placed(deploy_block(block)))
        proc = Proc(subprocess.Popen(["bash", str(script)], cwd=self.root, env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True))
        try:
            proc.popen.wait(timeout)
        finally:
            proc.kill9()
            (self.root / f"{block}.log").write_text(proc.text)
        return proc

    def windows(self) -> list[tuple]:
        out = ds.dataset(str(self.shared / "clicks-per-minute"), format="parquet", partitioning="hive",
                         ignore_prefixes=["_", "."]).to_table().to_pandas()
        return sorted(zip(out.key, out.window_start, out["count"]))

    def reference(self) -> list[tuple]:
        expected = self.events.assign(start=self.events.t.dt.floor("60s")).groupby(["key", "start"]).size()
        return sorted((k, pd.Timestamp(s), n) for (k, s), n in expected.items())


@pytest.mark.parametrize("block", ["spark-submit", "sparkpoint-run"])
def test_deploy_doc_commands_run_on_the_cluster_exactly_once(cluster, tmp_path, spark_defaults_dir,
                                                             driver_state_view, block):
    """`spark-submit --master spark://...` (and `sparkpoint run --set spark.master=...`) run
    on the master they were given, the executors on the venv's Python, keys from the
    environment: the committed windows equal pandas' over the same input."""
    run = DeployDocRun(cluster, tmp_path, spark_defaults_dir)
    proc = run.run(block)
    assert proc.popen.returncode == 0, proc.text[-4000:]
    assert run.windows() == run.reference()
    _assert_driver_wrote_no_state(cluster)
    # The subtasks ran on the workers: their state is on the workers' own disks.
    assert _job_state(cluster, 0, CLICKS_JOB) or _job_state(cluster, 1, CLICKS_JOB), proc.text[-3000:]


def test_a_driver_the_executors_cannot_reach_stops_with_one_line(cluster, tmp_path, spark_defaults_dir):
    """A driver advertised on an address the workers cannot connect to (here 127.0.0.2, where
    nothing listens) gets no executor; instead of Spark's endless "Initial job has not
    accepted any resources" the job stops with one line naming the address and what to set."""
    run = DeployDocRun(cluster, tmp_path, spark_defaults_dir)
    # The harness's spark-defaults make a session wait (up to 60 s, inside SparkContext's
    # start) until every worker's executor registered; none ever does here. Spark's own
    # default on a standalone master does not wait, as for a user: the stop must come from
    # sparkpoint's registration timeout, not from that wait.
    cmd = [sys.executable, "-m", "sparkpoint.ops.cli", "run", "clicks_job.py",
           "--set", f"spark.master={cluster.master_url}",
           "--set", "spark.conf.spark.scheduler.minRegisteredResourcesRatio=0",
           "--set", "spark.conf.spark.driver.host=127.0.0.2", "--set", "spark.conf.spark.driver.bindAddress=127.0.0.1",
           "--set", "sparkpoint.executor-registration.timeout=5 s",
           "--set", f"execution.checkpointing.dir={run.shared / 'checkpoints'}",
           "--set", f"state.local.dir={cluster.state_path}"]
    # Without the wait the job would hang here for ever: the timeout fails the test.
    done = subprocess.run(cmd, cwd=tmp_path, env={**run.env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                          capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if line.startswith("sparkpoint: error:")]
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert len(errors) == 1, done.stderr[-3000:]
    assert "127.0.0.2" in errors[0] and "cannot connect back to the driver" in errors[0]
    assert "spark.conf.spark.driver.host" in errors[0] and cluster.master_url in errors[0]


# ---------------------------------------------------------------- a graph: join, then aggregate
def test_cluster_join_graph_with_a_worker_killed_mid_run_equals_pandas(cluster, tmp_path, driver_state_view):
    """tests/paid_orders.py's graph (orders left-joined with payments within 15 minutes, then
    revenue per customer, two sinks) on the cluster, one worker killed once checkpoints
    completed: the join's and the aggregate's subtasks are rebuilt on the surviving worker
    from durable state, and both sinks' committed output equals the pandas answer."""
    from tests.paid_orders import assert_exactly_once, pipeline_text, write_input

    files = 12
    orders, payments = write_input(tmp_path / "in", files)
    text = pipeline_text("cluster_join", tmp_path / "in", tmp_path / "job" / "out", pace_s=0.2)
    job = Job(tmp_path / "job", name="cluster_join", template=text.replace("{", "{{").replace("}", "}}"),
              sets=[*spark_settings(cluster), f"state.local.dir={cluster.state_path}",
                    "execution.checkpointing.interval=500 ms"])
    proc, before_kill = _run_killing_a_worker(cluster, job, tmp_path)
    assert any(re.search(COMPLETED, line) for line in proc.lines[before_kill:]), proc.text[-3000:]
    # Losing an executor costs a rebuild of its subtasks, not a failover (DESIGN.md 2a).
    restarts = re.search(r"(\d+) restarts", proc.text)
    assert restarts and restarts.group(1) == "0", proc.text[-3000:]
    assert_exactly_once(job.out, orders, payments)
    _assert_driver_wrote_no_state(cluster)
    # Every subtask ended up on the surviving worker, with its state on that worker's disk.
    assert _job_state(cluster, 0, "cluster_join")
