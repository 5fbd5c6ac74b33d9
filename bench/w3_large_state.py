"""W3 on sparkpoint: large state. KeyedAggregate(count, sum) over --keys keys (10 M),
parallelism 2, run as a real `sparkpoint run` subprocess (as tests/e2e/harness.py):

    python bench/w3_large_state.py [--keys 10000000] [--change-fraction 0.01] [--runs 1]
        [--work /tmp/sparkpoint-bench-w3] [--change-epochs-before-kill 8] [--restore-modes local,remote]

Per run:
  1. a load phase (every key once, --load-epoch-records per epoch), then change epochs in
     which keys * change_fraction distinct keys get one event each (bench/w3_source.py),
     checkpoints every --interval (default 1 s; at the end of the epoch in which it is due);
  2. SIGKILL of the whole process group once --change-epochs-before-kill change epochs are
     in a completed checkpoint; then, per --restore-modes entry, a restart of the same
     command: `local` keeps state.local.dir (the executor's disk survived), `remote` deletes
     it first (a new machine: every byte comes from checkpoint storage). Before every
     restart the checkpoint files are evicted from the page cache (fdatasync +
     posix_fadvise DONTNEED; /proc/sys/vm/drop_caches is read-only in this container).
     Every restart but the last is killed again after its first completed checkpoint; the
     last runs to the end and prints its state statistics (rebuild time, bytes downloaded);
  3. the disk's sequential read bandwidth, measured in the same run on the same
     filesystem: a fresh file (--disk-test-mb) written and fsynced, evicted from the page
     cache, read sequentially in 4 MiB chunks (buffered, as the restore reads); an
     O_DIRECT read (dd iflag=direct bs=4M) is reported beside it;
  4. peak RSS, polled every 0.25 s over the job's process tree (its session): the driver
     (the `sparkpoint run` Python process) and the executor side (the JVM - in local[2]
     Spark's driver and executor share it - plus the Python workers), as a sum of RSS
     (shared pages of forked workers counted per process) and of PSS.

Definitions (also in the RESULT lines' `definitions` field):
  changed_state_bytes  - of one checkpoint: sum over the key-value pairs written to RocksDB
      by the change epochs since the previous checkpoint of len(key) + len(value) as stored
      (the key-group-prefixed encoded key and the encoded count+sum value), read back from
      those epochs' change logs. A key changed in two of those epochs would count twice;
      the source changes distinct keys in every window of `keys` events, so it never does.
  bytes_per_checkpoint - what the coordinator reports for the checkpoint
      (`completed checkpoint N ... (B bytes ...)`): change logs written since the previous
      barrier plus the bytes a periodic snapshot uploaded in that interval.
  ratio_uploaded_to_changed - median over change-phase checkpoints of bytes / changed bytes;
      `_mean` variants amortize the periodic snapshot uploads.
  restore_s - from starting the restarted process to its "resuming from checkpoint" line
      (after every subtask rebuilt its store on an executor; the first epoch runs next);
      restore_bytes - the restored checkpoint's state in checkpoint storage (the snapshot
      files + change logs its lineages reference); restore_mb_per_s = restore_bytes / restore_s.
      state_rebuild_* - the executor-side part alone (max over subtasks, which rebuild in parallel).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from w3_source import W3Source  # noqa: E402

JOB = "w3"
OPERATOR = "w3"
MB = 1e6

PIPELINE = """
import sys
sys.path.insert(0, {here!r})
from sparkpoint import KeyedAggregate, ParquetSink, Pipeline
from w3_source import W3Source

pipeline = (
    Pipeline({job!r})
    .source(W3Source("events", keys={keys}, changed={changed}, change_epochs={change_epochs},
                     load_epoch_records={load_epoch_records}))
    .stateful(KeyedAggregate({op!r}, ["key"], "value", aggs=("count", "sum"), value_type="bigint"))
    .sink(ParquetSink({out!r}))
)
"""

DEFINITIONS = {
    "changed_state_bytes": "per checkpoint: sum of len(key)+len(value) of the RocksDB writes of the change epochs "
                           "since the previous checkpoint, as stored (read back from their change logs)",
    "bytes_per_checkpoint": "coordinator's bytes for the checkpoint: change logs since the previous barrier + "
                            "periodic snapshot uploads in that interval",
    "restore_s": "restarted process start -> 'resuming from checkpoint' line (state rebuilt on the executors)",
    "restore_bytes": "snapshot files + change logs referenced by the restored checkpoint's lineages",
    "disk_read_mb_per_s": "sequential buffered read (4 MiB chunks) of a fresh fsynced file evicted with "
                          "posix_fadvise(DONTNEED), same filesystem as checkpoint storage",
    "peak_rss": "max over 0.25 s samples; driver = `sparkpoint run` python; executors = JVM (local[2]: Spark "
                "driver+executor) + Python workers, summed RSS (pss: summed PSS)",
}


# -- process tree memory ------------------------------------------------------------------
def _session_pids(sid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # field 6 of stat: session id
                pids.append(int(name))
        except (OSError, IndexError, ValueError):
            pass
    return pids


def _rss_pss_kb(pid: int) -> tuple[int, int]:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            rss = pss = 0
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
            return rss, pss
    except OSError:
        return 0, 0


class MemoryPoller:
    def __init__(self, root_pid: int, interval: float = 0.25):
        self.root, self.interval = root_pid, interval
        self.peak = {"driver_rss": 0, "driver_pss": 0, "exec_rss": 0, "exec_pss": 0, "jvm_rss": 0, "workers_rss": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            sample = dict.fromkeys(self.peak, 0)
            for pid in _session_pids(self.root):
                rss, pss = _rss_pss_kb(pid)
                if pid == self.root:
                    sample["driver_rss"] += rss
                    sample["driver_pss"] += pss
                    continue
                sample["exec_rss"] += rss
                sample["exec_pss"] += pss
                try:
                    with open(f"/proc/{pid}/comm") as f:
                        comm = f.read().strip()
                except OSError:
                    comm = ""
                sample["jvm_rss" if comm == "java" else "workers_rss"] += rss
            for k, v in sample.items():
                self.peak[k] = max(self.peak[k], v)
            self._stop.wait(self.interval)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(5)
        return {k: v / 1024 for k, v in self.peak.items()}


# -- the job process ------------------------------------------------------------------------
class JobProcess:
    """`sparkpoint run` in its own session; every output line is kept with its arrival time."""

    def __init__(self, cmd: list[str], cwd: str, log_path: str):
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join([REPO, HERE, os.environ.get("PYTHONPATH", "")]))
        self.started = time.monotonic()
        self.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                                      env=env, start_new_session=True)
        self.memory = MemoryPoller(self.popen.pid)
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        self._log = open(log_path, "w", buffering=1)  # line-buffered: readable while it runs
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            t = time.monotonic() - self.started
            self._log.write(f"{t:9.3f} {line}")
            with self._cond:
                self.lines.append((t, line.rstrip("\n")))
                self._cond.notify_all()
        self._log.flush()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float, start_at: int = 0) -> tuple[int, float, re.Match]:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        i = start_at
        with self._cond:
            while True:
                while i < len(self.lines):
                    m = rx.search(self.lines[i][1])
                    if m:
                        return i, self.lines[i][0], m
                    i += 1
                if self.popen.poll() is not None:
                    self._cond.wait(0.5)
                    if i >= len(self.lines):
                        raise RuntimeError(f"job exited ({self.popen.returncode}) before /{pattern}/:\n" + self.tail())
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out waiting for /{pattern}/:\n" + self.tail())
                self._cond.wait(0.5)

    def tail(self, n: int = 40) -> str:
        return "\n".join(line for _, line in self.lines[-n:])

    def first_time(self, pattern: str) -> float | None:
        rx = re.compile(pattern)
        return next((t for t, line in self.lines if rx.search(line)), None)

    def kill9(self) -> dict[str, float]:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.finish(30)

    def finish(self, timeout: float) -> dict[str, float]:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(30)
        self._reader.join(10)
        self._log.close()
        # Orphans of the session (a python worker the JVM had not reaped) die with it.
        for pid in _session_pids(self.popen.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return self.memory.stop()


# -- checkpoint storage ---------------------------------------------------------------------
def storage(ckpt_dir: str):
    from sparkpoint.storage.fs import StorageFS
    from sparkpoint.storage.layout import JobLayout

    fs = StorageFS.from_url(ckpt_dir)
    return fs, JobLayout(os.path.join(ckpt_dir, JOB))


def checkpoint_data(ckpt_dir: str, checkpoint_id: int):
    from sparkpoint.storage.metadata import read_completed

    fs, layout = storage(ckpt_dir)
    return read_completed(fs, layout, checkpoint_id)


def lineages_of(data) -> dict[int, dict]:
    return {int(k.rsplit("/", 1)[1]): h for k, h in data.handles.items() if k.startswith(f"state:{OPERATOR}/")}


def checkpoint_epoch(data) -> int:
    return int(data.handles["job"]["epoch"])


def changed_state(ckpt_dir: str, data, after_epoch: int) -> tuple[int, int, int]:
    """(distinct keys written, sum of len(key)+len(value) as stored, change-log bytes) of the
    change epochs in (after_epoch, checkpoint epoch], over all subtasks."""
    from sparkpoint.state.changelog import decode_changes

    fs, layout = storage(ckpt_dir)
    keys = kv_bytes = log_bytes = 0
    for lin in lineages_of(data).values():
        for f in lin["changelog"]["files"]:
            if int(f["epoch"]) <= after_epoch:
                continue
            raw = fs.read_bytes(layout.join(f["path"]))
            log_bytes += len(raw)
            table = decode_changes(raw, f["path"])
            keys += table.num_rows
            kv_bytes += sum(len(k) for k in table.column("key").to_pylist())
            kv_bytes += sum(len(v) for v in table.column("value").to_pylist() if v is not None)
    return keys, kv_bytes, log_bytes


def state_files(data) -> list[tuple[str, int]]:
    """(job-relative path, size) of every file the checkpoint's lineages reference."""
    out = []
    for lin in lineages_of(data).values():
        for f in (lin.get("base") or {}).get("files") or []:
            out.append((f["path"], int(f["size"])))
        for f in lin["changelog"]["files"]:
            out.append((f["path"], int(f["size"])))
    return out


def evict(paths: list[str]) -> None:
    """Drop these files' pages from the page cache (they are clean after fdatasync)."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def evict_tree(root: str) -> None:
    evict([os.path.join(d, n) for d, _, names in os.walk(root) for n in names])


def cached_fraction(paths: list[str]) -> float | None:
    """Share of these files' pages in the page cache (util-linux fincore), or None."""
    if not shutil.which("fincore") or not paths:
        return None
    proc = subprocess.run(["fincore", "-b", "-n", "-o", "RES,SIZE", *paths], capture_output=True, text=True)
    res = size = 0
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            res += int(parts[0])
            size += int(parts[1])
    return res / size if size else None


# -- disk bandwidth -------------------------------------------------------------------------
def disk_read_bandwidth(directory: str, size_mb: int) -> dict[str, float]:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "disk-test.bin")
    chunk = os.urandom(4 << 20)
    with open(path, "wb") as f:
        for _ in range(max(1, size_mb // 4)):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    size = os.path.getsize(path)
    evict([path])
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(4 << 20):
            pass
    buffered = size / (time.perf_counter() - started) / MB
    evict([path])
    direct = None
    dd = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4M", "iflag=direct"], capture_output=True, text=True)
    m = re.search(r"copied, ([\d.]+) s", dd.stderr)
    if dd.returncode == 0 and m:
        direct = size / float(m.group(1)) / MB
    os.unlink(path)
    return {"disk_read_mb_per_s": buffered, "disk_read_direct_mb_per_s": direct, "disk_test_bytes": size}


# -- offline profile of the restore ---------------------------------------------------------
def profile_restore(ckpt_dir: str, data, scratch: str) -> dict[str, float]:
    """Time, in this process and one subtask after the other, what a rebuild does: download +
    verify the snapshot (sparkpoint.state.restore.restore_snapshot, cold cache), open it,
    then fetch + decode + apply the change logs (as SubtaskState._replay does)."""
    from sparkpoint.state.changelog import Lineage, decode_changes
    from sparkpoint.state.restore import restore_snapshot
    from sparkpoint.state.store import SubtaskStateStore

    fs, layout = storage(ckpt_dir)
    evict([layout.join(p) for p, _ in state_files(data)])
    out = {"download_verify_s": 0.0, "open_s": 0.0, "replay_fetch_s": 0.0, "replay_apply_s": 0.0,
           "snapshot_bytes": 0, "changelog_bytes": 0, "changelogs": 0}
    for i, handle in sorted(lineages_of(data).items()):
        lin = Lineage.from_json(handle)
        target = os.path.join(scratch, f"profile-{i}")
        shutil.rmtree(target, ignore_errors=True)
        if lin.base is not None:
            t = time.perf_counter()
            report = restore_snapshot(lin.base, fs, layout, target)
            out["download_verify_s"] += time.perf_counter() - t
            out["snapshot_bytes"] += report.bytes_remote
        t = time.perf_counter()
        store = SubtaskStateStore.open(target, create=True, operator=lin.operator, key_groups=range(*lin.key_groups),
                                       max_parallelism=lin.max_parallelism)
        out["open_s"] += time.perf_counter() - t
        for c in lin.changelog:
            t = time.perf_counter()
            raw = fs.read_bytes(layout.join(c.file.path))
            table = decode_changes(raw, c.ref)
            keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
            t2 = time.perf_counter()
            store.apply_changes(keys, values)
            store.commit_epoch(c.epoch, _empty(), {"ref": c.ref})
            out["replay_apply_s"] += time.perf_counter() - t2
            out["replay_fetch_s"] += t2 - t
            out["changelog_bytes"] += len(raw)
            out["changelogs"] += 1
        store.close()
        shutil.rmtree(target, ignore_errors=True)
    return out


def _empty():
    import pyarrow as pa

    return pa.table({})


# -- one run ----------------------------------------------------------------------------------
def run_once(args: argparse.Namespace, run: int) -> list[dict[str, Any]]:
    root = os.path.join(args.work, f"w3-{run}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    changed = max(2, int(round(args.keys * args.change_fraction)))
    changed -= changed % 2
    change_epochs = args.change_epochs_before_kill + args.change_epochs_after
    src = W3Source(keys=args.keys, changed=changed, change_epochs=change_epochs,
                   load_epoch_records=args.load_epoch_records)
    load_epochs = src.load_epochs()  # epochs 0 .. load_epochs-1 load; then change epochs
    ckpt_dir = os.path.join(root, "checkpoints")
    state_dir = os.path.join(root, "state")
    pipeline_file = os.path.join(root, "w3_pipeline.py")
    with open(pipeline_file, "w") as f:
        f.write(PIPELINE.format(here=HERE, job=JOB, keys=args.keys, changed=changed, change_epochs=change_epochs,
                                load_epoch_records=args.load_epoch_records, op=OPERATOR,
                                out=os.path.join(root, "output")))
    sets = [f"execution.checkpointing.dir={ckpt_dir}", f"state.local.dir={state_dir}",
            f"execution.checkpointing.interval={args.interval}", "parallelism.default=2",
            "sparkpoint.lease.ttl=4 s", "rest.port=0", *args.set]
    cmd = [sys.executable, "-m", "sparkpoint.ops.cli", "--log-level", "INFO", "run", pipeline_file]
    for s in sets:
        cmd += ["--set", s]
    print(f"# run {run}: {args.keys:,} keys, {changed:,} changed per epoch, {load_epochs} load epochs; "
          f"logs in {root}/*.log", file=sys.stderr, flush=True)

    # 1. load + change epochs, then SIGKILL
    completed_rx = r"completed checkpoint (\d+) of job \S+ \((\d+) bytes in (\d+) ms\)"
    job = JobProcess(cmd, root, os.path.join(root, "run-0.log"))
    checkpoints = []  # (id, bytes, ms, epoch)
    per_ckpt = []
    load_done_s = None
    at = 0
    kill_epoch = load_epochs - 1 + args.change_epochs_before_kill
    while True:
        at, t_done, m = job.wait_for(completed_rx, args.timeout, at)
        at += 1
        cid, size, ms = int(m.group(1)), int(m.group(2)), int(m.group(3))
        data = checkpoint_data(ckpt_dir, cid)  # read at once: older checkpoints are subsumed
        if data is None:
            continue
        epoch = checkpoint_epoch(data)
        prev = checkpoints[-1][3] if checkpoints else None
        if prev is not None and prev >= load_epochs - 1 and epoch > prev:
            keys_changed, kv, log_bytes = changed_state(ckpt_dir, data, prev)
            # A snapshot taken in this interval replaced those epochs' change logs in the
            # lineage: their sizes are filled in below from the other checkpoints' per-epoch figure.
            per_ckpt.append({"id": cid, "epochs": epoch - prev, "bytes": size, "ms": ms,
                             "changed_keys": keys_changed if kv else None, "changed_state_bytes": kv or None,
                             "changelog_bytes": log_bytes if kv else None, "snapshot_in_interval": not kv})
        checkpoints.append((cid, size, ms, epoch))
        if load_done_s is None and epoch >= load_epochs - 1:
            load_done_s = t_done  # job start -> first checkpoint holding the whole load phase
        if epoch >= kill_epoch:
            break
    memory_first = job.kill9()
    killed_at = checkpoints[-1]

    # per_ckpt: change-phase checkpoints only (the previous one already covered the load)
    known = [c for c in per_ckpt if c["changed_state_bytes"]]
    if not known:
        raise RuntimeError("no checkpoint completed in the change phase; raise --change-epochs-before-kill")
    per_epoch = {f: statistics.median(c[f] / c["epochs"] for c in known)
                 for f in ("changed_keys", "changed_state_bytes", "changelog_bytes")}
    for c in per_ckpt:
        if not c["changed_state_bytes"]:
            c.update({f: v * c["epochs"] for f, v in per_epoch.items()})
        c["ratio"] = c["bytes"] / c["changed_state_bytes"]

    restored_last = checkpoint_data(ckpt_dir, killed_at[0])
    state_bytes_at_kill = sum(s for _, s in state_files(restored_last))

    disk = disk_read_bandwidth(os.path.join(root, "disk-test"), max(args.disk_test_mb, 0))

    # 2. restarts
    results = []
    modes = [m for m in args.restore_modes.split(",") if m]
    for n, mode in enumerate(modes):
        last = n == len(modes) - 1
        if mode == "remote":
            shutil.rmtree(state_dir, ignore_errors=True)
        evict_tree(ckpt_dir)
        evict_tree(state_dir)
        fs, layout = storage(ckpt_dir)
        cached_before = cached_fraction([layout.join(p) for p, _ in state_files(restored_last)])
        job = JobProcess(cmd, root, os.path.join(root, f"restart-{n}-{mode}.log"))
        _, t_resumed, m = job.wait_for(r"resuming from checkpoint (\d+)", args.timeout)
        restored_id = int(m.group(1))
        data = checkpoint_data(ckpt_dir, restored_id)
        files = state_files(data)
        restore_bytes = sum(s for _, s in files)
        t_first_epoch = None
        try:
            i, t_first_epoch, _ = job.wait_for(completed_rx, args.timeout)
        except RuntimeError:
            pass
        # Where the restart's time goes (seconds since the process started):
        t_spark = job.first_time(r"restores from checkpoint \d+")  # Python + Spark (JVM) up, metadata read
        t_epoch = None
        try:
            _, t_epoch, _ = job.wait_for(r"RUNNING epoch \d+", args.timeout)  # the first epoch after the restore
        except RuntimeError:
            pass
        state_json = None
        if last:
            job.wait_for(r"state \(json\)\s*:", args.timeout)
            memory = job.finish(args.timeout)
            line = next(l for _, l in job.lines if "state (json)" in l)
            state_json = json.loads(line.split(":", 1)[1])
        else:
            memory = job.kill9()
        restore_s = t_resumed
        out = {
            "system": "sparkpoint", "workload": "w3", "config": f"restore-{mode}", "run": run,
            "keys": args.keys, "change_fraction": args.change_fraction, "changed_keys": changed,
            "load_epochs": load_epochs, "interval": args.interval,
            "checkpoints_measured": len(per_ckpt),
            "bytes_per_checkpoint_median": statistics.median(c["bytes"] for c in per_ckpt),
            "bytes_per_checkpoint_mean": statistics.mean(c["bytes"] for c in per_ckpt),
            "changed_state_bytes": statistics.median(c["changed_state_bytes"] for c in per_ckpt),
            "changed_keys_per_checkpoint_median": statistics.median(c["changed_keys"] for c in per_ckpt),
            "ratio_uploaded_to_changed": statistics.median(c["ratio"] for c in per_ckpt),
            "ratio_uploaded_to_changed_mean": (sum(c["bytes"] for c in per_ckpt)
                                               / sum(c["changed_state_bytes"] for c in per_ckpt)),
            "changelog_to_changed": statistics.median(c["changelog_bytes"] / c["changed_state_bytes"]
                                                      for c in per_ckpt),
            "ratio_uploaded_to_changed_max": max(c["ratio"] for c in per_ckpt),
            "checkpoints_with_snapshot_upload": sum(c["snapshot_in_interval"] for c in per_ckpt),
            "ckpt_ms_median": statistics.median(c["ms"] for c in per_ckpt),
            "load_phase_s": load_done_s,
            "state_bytes_at_kill": state_bytes_at_kill,
            "restored_checkpoint": restored_id,
            "restore_s": restore_s,
            "restore_bytes": restore_bytes,
            "restore_files_cached_before": cached_before,
            "restore_mb_per_s": restore_bytes / restore_s / MB,
            **disk,
            "restore_fraction_of_disk": restore_bytes / restore_s / MB / disk["disk_read_mb_per_s"],
            "restart_to_first_checkpoint_s": t_first_epoch,
            "restart_spark_ready_s": t_spark,
            "restore_job_s": t_resumed - t_spark if t_spark is not None else None,
            "restart_first_epoch_done_s": t_epoch,
            "peak_rss_driver_mb": max(memory["driver_rss"], memory_first["driver_rss"]),
            "peak_rss_executors_mb": max(memory["exec_rss"], memory_first["exec_rss"]),
            "peak_pss_executors_mb": max(memory["exec_pss"], memory_first["exec_pss"]),
            "peak_rss_jvm_mb": max(memory["jvm_rss"], memory_first["jvm_rss"]),
            "peak_rss_python_workers_mb": max(memory["workers_rss"], memory_first["workers_rss"]),
            "peak_rss_driver_mb_restart": memory["driver_rss"],
            "peak_rss_executors_mb_restart": memory["exec_rss"],
            "checkpoints": per_ckpt if args.verbose else None,
        }
        if state_json is not None:
            rebuild_s = (state_json.get("rebuild_ms_max") or 0) / 1000
            out.update({"state_rebuild_s_max": rebuild_s, "state_rebuilds": state_json.get("rebuilds"),
                        "state_bytes_downloaded": state_json.get("bytes_downloaded"),
                        "state_replayed_changelogs": state_json.get("replayed_changelogs"),
                        "state_rebuild_mb_per_s": restore_bytes / rebuild_s / MB if rebuild_s else None,
                        "state_rebuild_fraction_of_disk": (restore_bytes / rebuild_s / MB / disk["disk_read_mb_per_s"]
                                                           if rebuild_s else None)})
        out["loadavg_1m_after"] = os.getloadavg()[0]
        out["definitions"] = DEFINITIONS if run == args.first_run and n == 0 else None
        results.append(out)
        print("RESULT " + json.dumps(out), flush=True)
    if args.profile:
        fs, layout = storage(ckpt_dir)
        ids = sorted(int(n[4:]) for n in os.listdir(layout.root) if n.startswith("chk-")
                     and os.path.exists(os.path.join(layout.root, n, "_metadata")))
        prof = profile_restore(ckpt_dir, checkpoint_data(ckpt_dir, ids[-1]), root)
        prof["checkpoint"] = ids[-1]
        print("PROFILE " + json.dumps({"run": run, **prof}), flush=True)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--change-fraction", type=float, default=0.01)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--first-run", type=int, default=0)
    parser.add_argument("--work", default="/tmp/sparkpoint-bench-w3")
    parser.add_argument("--load-epoch-records", type=int, default=1_000_000)
    parser.add_argument("--change-epochs-before-kill", type=int, default=8)
    parser.add_argument("--change-epochs-after", type=int, default=6)
    parser.add_argument("--interval", default="1 s", help="execution.checkpointing.interval")
    parser.add_argument("--restore-modes", default="local,remote",
                        help="restarts in order: local (state.local.dir kept), remote (deleted first)")
    parser.add_argument("--disk-test-mb", type=int, default=1024)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--set", action="append", default=[], help="extra --set for the job")
    parser.add_argument("--profile", action="store_true", help="also time a restore step by step in this process")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, checkpoints)")
    parser.add_argument("--verbose", action="store_true", help="per-checkpoint figures in the RESULT lines")
    args = parser.parse_args()
    for run in range(args.first_run, args.first_run + args.runs):
        run_once(args, run)


if __name__ == "__main__":
    main()
