"""Shared pieces of the storage-safety and seed end-to-end tests: one small keyed-aggregate job,
its expected output (computed from the input alone), reading what a job left in
checkpoint storage (each subtask's state is a lineage: snapshot + change logs), killing a
run at a chosen moment, and ways real checkpoint files get damaged."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from sparkpoint.state.changelog import Lineage, is_lineage_handle
from sparkpoint.state.snapshot import SnapshotFile
from sparkpoint.storage import metadata
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout
from tests.e2e.chaos_oracles import aggregate_updates, as_canonical
from tests.e2e.harness import AGGREGATE_PIPELINE, Job, Proc
from tests.servers.spark_cluster import all_pids, proc_stat

JOB_NAME = "e2e"
OPERATOR = "totals"
# Small on purpose: 10 input epochs, several checkpoints, ~30 s of work per run.
JOB_SHAPE: dict[str, Any] = dict(name=JOB_NAME, template=AGGREGATE_PIPELINE, keys=50, total=20_000,
                                 per_epoch=2_000)
# Snapshots by count only (a subtask uploads one once it has 4 change logs), so which
# checkpoints share a snapshot does not depend on how fast a loaded machine runs.
SNAPSHOT_EVERY_4_EPOCHS = ["state.changelog.max-changelogs=4", "state.changelog.periodic-materialize.interval=10 min"]


def make_job(root: Path, **overrides: Any) -> Job:
    return Job(root, **{**JOB_SHAPE, **overrides})


def expected_updates(columns: list[str], total: int = JOB_SHAPE["total"]) -> list[tuple]:
    """What every correct run of JOB_SHAPE (with `total` events) commits, in `canonical`'s
    form for a table with `columns`: update-mode rows are a pure function of the epoch
    boundaries, which are a pure function of the input (tests/e2e/chaos_oracles.py), so no
    failure-free reference job has to run."""
    return as_canonical(aggregate_updates(total, keys=JOB_SHAPE["keys"],
                                          per_epoch=JOB_SHAPE["per_epoch"]), columns)


# -- reading a job directory ------------------------------------------------------------

def job_storage(url: str, storage_options: dict | None = None, job_name: str = JOB_NAME
                ) -> tuple[StorageFS, JobLayout]:
    fs = StorageFS.from_url(url, storage_options)
    return fs, JobLayout(f"{fs.root}/{job_name}")


def completed_checkpoints(fs: StorageFS, layout: JobLayout) -> dict[int, Any]:
    """checkpoint id -> decoded metadata, for every `chk-<id>/_metadata` present."""
    found = {}
    for name in fs.ls(layout.root):
        m = re.fullmatch(r"chk-(\d+)", name)
        if m and fs.exists(layout.metadata(int(m.group(1)))):
            cid = int(m.group(1))
            found[cid] = metadata.decode(fs.read_bytes(layout.metadata(cid)), layout.job_name)
    return found


def chk_dir_ids(fs: StorageFS, layout: JobLayout) -> set[int]:
    return {int(m.group(1)) for m in (re.fullmatch(r"chk-(\d+)", n) for n in fs.ls(layout.root)) if m}


def state_handles(data) -> dict[str, dict]:
    """participant (`state:<op>/<i>`) -> its raw lineage handle in one checkpoint."""
    return {p: h for p, h in data.handles.items() if is_lineage_handle(h)}


def lineages(data) -> dict[str, Lineage]:
    """participant (`state:<op>/<i>`) -> its lineage (snapshot + change logs) in one checkpoint."""
    return {p: Lineage.from_json(h) for p, h in data.handles.items() if is_lineage_handle(h)}


def state_files(data) -> list[SnapshotFile]:
    """Every checkpoint-storage file the state of one checkpoint needs."""
    return [f for lineage in lineages(data).values() for f in lineage.files()]


def changelogs_only_in(done: dict[int, Any], latest: int, older: int,
                       participant: str | None = None) -> list[SnapshotFile]:
    """Change logs that checkpoint `latest` references for epochs after checkpoint
    `older`'s and that no other checkpoint in `done` references (of one participant,
    or of all): damaging one breaks `latest` and nothing else."""
    kept_by_others = {f.path for cid, data in done.items() if cid != latest for f in state_files(data)}
    after = int(done[older].handles["job"]["epoch"])
    return [c.file for p, lineage in sorted(lineages(done[latest]).items()) if participant in (None, p)
            for c in lineage.changelog if c.epoch > after and c.file.path not in kept_by_others]


# -- driving a running process ----------------------------------------------------------

COMPLETED = r"completed checkpoint \d+ of job"
T = TypeVar("T")


def wait_completed(proc: Proc, count: int, timeout: float = 300) -> None:
    """Until `proc` logged `count` completed checkpoints (polls the process's log)."""
    deadline = time.monotonic() + timeout
    while proc.count(COMPLETED) < count:
        assert proc.popen.poll() is None, f"exited before {count} checkpoints:\n{proc.text[-3000:]}"
        assert time.monotonic() < deadline, f"no {count} checkpoints in time:\n{proc.text[-3000:]}"
        time.sleep(0.2)


def _process_groups(root: int) -> set[int]:
    """The process groups of `root` and of all its descendants. PySpark's daemon puts itself
    and its Python workers in a group of their own, which a signal to the job's group misses."""
    parents: dict[int, list[int]] = {}
    groups: dict[int, int] = {}
    for pid in all_pids():
        stat = proc_stat(pid)
        if stat is not None:  # None: gone meanwhile
            parents.setdefault(stat[1], []).append(pid)
            groups[pid] = stat[2]
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in groups:
            found.add(groups[pid])
        todo += parents.get(pid, [])
    return found


def _signal_groups(groups: set[int], sig: int) -> None:
    for group in groups:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            pass


def kill_when(proc: Proc, plan: Callable[[], T | None], timeout: float = 300) -> T:
    """SIGKILL `proc` at a moment `plan()` returns something, and return that. The run
    (the job's process group and its Python workers' groups) is frozen (SIGSTOP) while the
    plan is checked again, so what it describes is exactly what the kill leaves behind: a
    Python worker left running could still delete a local snapshot the plan names."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.popen.poll() is None, f"exited before the moment to kill it:\n{proc.text[-3000:]}"
        assert time.monotonic() < deadline, f"the moment to kill never came:\n{proc.text[-3000:]}"
        if plan() is not None:
            groups = _process_groups(proc.popen.pid)
            _signal_groups(groups, signal.SIGSTOP)
            found = plan()
            if found is not None:
                _signal_groups(groups, signal.SIGKILL)
                proc.kill9()
                return found
            _signal_groups(groups, signal.SIGCONT)
        time.sleep(0.2)


def completed_ids(proc: Proc) -> list[int]:
    return [int(x) for x in re.findall(r"completed checkpoint (\d+) of job", proc.text)]


def subtask_dir(job: Job, subtask: int) -> Path:
    """The executor-local directory of one subtask (`db/`, `snap-<epoch>/`, `pending/`)."""
    from sparkpoint.runtime.executor.state import job_local_root

    checkpoints = job.checkpoint_dir or str((job.root / "checkpoints").absolute())
    return Path(job_local_root(str(job.root / "state"), JOB_NAME, checkpoints)) / OPERATOR / f"subtask-{subtask}"


def local_copy(job: Job, subtask: int, base_epoch: int) -> Path:
    """The local recovery copy of the snapshot of `base_epoch` this executor uploaded."""
    return subtask_dir(job, subtask) / f"snap-{base_epoch}"


# -- how real RocksDB files get damaged (same as tests/unit/snapshot) -------------------

def bad_magic(path: Path) -> None:
    """RocksDB's "Bad table magic number": the footer's last 8 bytes are wrong."""
    data = bytearray(path.read_bytes())
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])
    path.write_bytes(bytes(data))


def flipped_bytes(path: Path, at: int = 64) -> None:
    """Bit rot inside the first data block: size unchanged, footer intact."""
    data = bytearray(path.read_bytes())
    for i in range(at, min(at + 16, len(data))):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
