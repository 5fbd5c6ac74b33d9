"""Run on a real Spark cluster.

The job runs through the public CLI (`python -m sparkpoint.ops.cli run ...`) as a client-mode
driver against a standalone master with two 1-core workers. `state.local.dir` is the workers'
private state path (each executor's own local disk); the checkpoint and output directories
are on the file system every process shares, like a shared FS. The committed output must
equal a failure-free run on local[2] row for row (update-mode rows included: epoch
boundaries are a pure function of the sources' positions), whether nothing fails, a worker
dies mid-run, or the driver is SIGKILLed and the same command is run again.
"""

from __future__ import annotations

import re
import shutil
import time

import pytest

from tests.e2e.harness import AGGREGATE_PIPELINE, Job, Proc, canonical
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
def reference(tmp_path_factory) -> list[tuple]:
    """The failure-free run on embedded local[2]."""
    job = _job(tmp_path_factory.mktemp("reference"), "cluster_ref")
    proc = job.run(timeout=300)
    _finished(proc)
    rows = canonical(job.output(), drop=())
    assert rows, "the reference run committed no output"
    return rows


def test_cluster_output_equals_local(cluster, reference, tmp_path, driver_state_view):
    job = _cluster_job(cluster, tmp_path / "job", "cluster_a")
    proc = job.run(timeout=300)
    _save(proc, tmp_path / "driver.log")
    _finished(proc)
    assert _completed_checkpoints(proc) >= 2, proc.text[-3000:]
    got = canonical(job.output(), drop=())
    assert len(got) == len(reference)
    assert got == reference
    _assert_driver_wrote_no_state(cluster)
    # The state lived on the executors' own disks.
    assert _job_state(cluster, 0, "cluster_a") or _job_state(cluster, 1, "cluster_a")


def test_cluster_worker_killed_mid_run_is_exactly_once(cluster, reference, tmp_path, driver_state_view):
    job = _cluster_job(cluster, tmp_path / "job", "cluster_b")
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
    # The job went on on the remaining worker and still took checkpoints after the loss.
    assert any(re.search(COMPLETED, line) for line in proc.lines[before_kill:]), proc.text[-3000:]
    # Losing an executor costs a rebuild of its subtasks, not a failover (DESIGN.md 2a).
    restarts = re.search(r"(\d+) restarts", proc.text)
    assert restarts and restarts.group(1) == "0", proc.text[-3000:]
    assert canonical(job.output(), drop=()) == reference
    _assert_driver_wrote_no_state(cluster)
    # Every subtask ended up on the surviving worker, with its state on that worker's disk.
    assert _job_state(cluster, 0, "cluster_b")


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
