"""A real Spark standalone cluster on this machine, for tests: one master and N workers
started from the installed pyspark, everything bound to 127.0.0.1.

Each worker runs in its own mount namespace with a private tmpfs mounted at the SAME
absolute path (`state_path`) — the worker's "own local disk". Executors and their Python
workers are children of the worker and inherit its namespace, so
`state.local.dir=<state_path>` set once on the driver means each executor's own disk, as
on separate machines: no other worker and not the driver (which sees only the plain,
empty directory at `state_path`) can read what an executor wrote there. Everything else
(the checkpoint directory, the sink's output) is on the ordinary file system, which all
processes share like a shared FS.

    with StandaloneCluster(tmp / "cluster", workers=2, state_path=tmp / "executor-state") as c:
        sets = spark_settings(c)        # ["spark.master=spark://127.0.0.1:...", "spark.conf={...}"]
        ...
        c.kill_worker(1)                # SIGKILL the worker, its executors and their Python workers
        c.start_worker(1)               # a replacement worker (empty local disk)

Needs Linux, `unshare` and root (or CAP_SYS_ADMIN) for the per-worker mount namespaces.
Logs: `<root>/logs/master.log`, `<root>/logs/worker-<i>.log`; executors' stdout/stderr are
in `<root>/worker-<i>/work/<app-id>/<executor-id>/` (also the working directory of the
executor and of its Python workers); executors' Spark scratch dirs are under
`<root>/worker-<i>/local/`.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"<no log at {path}>"
    return f"--- {path} (last {lines} lines) ---\n" + "\n".join(text[-lines:])


def _mnt_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a live process, None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    rest = raw[raw.rfind(")") + 2:].split()
    return rest[0], int(rest[1]), int(rest[2])


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _alive(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


class ClusterError(RuntimeError):
    pass


class _Worker:
    def __init__(self, index: int):
        self.index = index
        self.proc: subprocess.Popen | None = None
        self.webui_port = 0
        self.ns: str | None = None  # mount namespace id, e.g. "mnt:[4026532701]"
        self.log: Path | None = None


class StandaloneCluster:
    """Spark standalone master + `workers` workers (each `cores` cores, `memory` memory)."""

    def __init__(self, root: Path, workers: int = 2, state_path: Path | None = None, *, cores: int = 1,
                 memory: str = "1g", tmpfs_size: str = "512m", start_timeout: float = 180.0):
        self.root = Path(root).resolve()
        self.state_path = Path(state_path).resolve() if state_path is not None else self.root / "executor-state"
        self.n_workers = workers
        self.cores = cores
        self.memory = memory
        self.tmpfs_size = tmpfs_size
        self.start_timeout = start_timeout
        self.spark_home = spark_home()
        self.logs = self.root / "logs"
        self.master_port = 0
        self.master_webui_port = 0
        self._master: subprocess.Popen | None = None
        self._workers = [_Worker(i) for i in range(workers)]
        self._files: list[Any] = []
        self._atexit = False

    # -- public API ------------------------------------------------------------------
    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def master_webui(self) -> str:
        return f"http://127.0.0.1:{self.master_webui_port}"

    @property
    def worker_pids(self) -> list[int | None]:
        """The worker JVM's pid per worker (None for a killed/stopped worker)."""
        return [w.proc.pid if w.proc is not None and w.proc.poll() is None else None for w in self._workers]

    def worker_dir(self, i: int) -> Path:
        """Worker i's `--work-dir`: executors run in `<it>/<app-id>/<executor-id>/`."""
        return self.root / f"worker-{i}" / "work"

    def __enter__(self) -> "StandaloneCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "StandaloneCluster":
        if shutil.which("unshare") is None:
            raise ClusterError("`unshare` (util-linux) is needed to give each worker a private state directory")
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.state_path.mkdir(parents=True, exist_ok=True)
        if any(self.state_path.iterdir()):
            raise ClusterError(f"state_path {self.state_path} must be empty: the driver's view of it is "
                               f"expected to stay empty")
        (self.root / "conf").mkdir(exist_ok=True)  # an empty SPARK_CONF_DIR: no stray spark-defaults
        if not self._atexit:
            atexit.register(self.stop)
            self._atexit = True
        try:
            for attempt in range(3):
                self._start_master()
                try:
                    # Before any worker: else their first registration fails and they retry 10 s later.
                    self._wait_for_master()
                    break
                except ClusterError:
                    if self._master.poll() is None or attempt == 2:
                        raise
                    self._master = None  # a port was taken since free_port() chose it: new ports
            for w in self._workers:
                self._spawn_worker(w)
            self.wait_for_workers(self.n_workers, respawns=2)
        except BaseException:
            self.stop()
            raise
        return self

    def start_worker(self, i: int, timeout: float | None = None) -> None:
        """(Re)start worker i — after kill_worker(i) this is a replacement machine with an
        empty local disk. Waits until the master reports it ALIVE."""
        w = self._workers[i]
        if w.proc is not None and w.proc.poll() is None:
            raise ClusterError(f"worker {i} is still running (pid {w.proc.pid})")
        self._spawn_worker(w)
        self.wait_for_workers(sum(1 for p in self.worker_pids if p is not None), timeout, respawns=2)

    def master_state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.master_webui}/json/", timeout=5) as r:
            return json.loads(r.read().decode())

    def alive_workers(self) -> list[dict[str, Any]]:
        """The master's ALIVE workers that belong to this cluster's worker processes."""
        ours = {w.webui_port for w in self._workers if w.proc is not None and w.proc.poll() is None}
        out = []
        for info in self.master_state().get("workers", []):
            port = int(str(info.get("webuiaddress", "")).rsplit(":", 1)[-1] or 0)
            if info.get("state") == "ALIVE" and port in ours:
                out.append(info)
        return out

    def wait_for_workers(self, n: int, timeout: float | None = None, respawns: int = 0) -> None:
        """Wait until n of our workers are ALIVE at the master; a worker that exits meanwhile
        (e.g. its web UI port was taken) is started again up to `respawns` times."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        last: Exception | str = "no answer yet"
        left = {w.index: respawns for w in self._workers}
        while time.monotonic() < deadline:
            for w in self._workers:
                if w.proc is not None and w.proc.poll() is not None and left[w.index] > 0:
                    left[w.index] -= 1
                    self.kill_worker(w.index)  # whatever is left of it
                    self._spawn_worker(w)
            self._check_running()
            try:
                alive = self.alive_workers()
                if len(alive) >= n:
                    return
                last = f"{len(alive)} of {n} workers ALIVE"
            except Exception as e:  # master not listening yet
                last = e
            time.sleep(0.5)
        raise ClusterError(f"Spark standalone cluster did not come up in {timeout or self.start_timeout:.0f}s "
                           f"({last})\n" + self._log_tails())

    def processes(self, i: int) -> list[int]:
        """Live pids of worker i: the worker JVM, its executors and their Python workers
        (everything in its mount namespace, plus anything descended from it)."""
        w = self._workers[i]
        return sorted(self._members(w))

    def state_files(self, i: int) -> list[str]:
        """Files in worker i's private state directory (paths relative to state_path), read
        through /proc/<worker pid>/root, i.e. as the worker sees its mounts: test-only
        introspection of "that machine's local disk". Worker i must be running."""
        pid = self.worker_pids[i]
        if pid is None:
            raise ClusterError(f"worker {i} is not running")
        private = Path(f"/proc/{pid}/root") / self.state_path.relative_to("/")
        return sorted(str(p.relative_to(private)) for p in private.rglob("*") if p.is_file())

    def kill_worker(self, i: int) -> list[int]:
        """SIGKILL worker i, its executor JVMs and their Python workers (which put themselves
        in their own process groups, so a group kill is not enough: everything in the worker's
        mount namespace dies). Returns the pids killed; raises if any survives."""
        w = self._workers[i]
        killed: set[int] = self._members(w)
        if w.proc is not None:
            try:
                os.killpg(w.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for _ in range(50):
            pids = self._members(w)
            if not pids:
                break
            for pid in pids:
                killed.add(pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        if w.proc is not None:
            try:
                w.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in killed | self._members(w)):
            time.sleep(0.1)
        survivors = sorted(p for p in killed | self._members(w) if _alive(p))
        if survivors:
            raise ClusterError(f"worker {i}: processes {survivors} survived SIGKILL")
        # Forget the pid and namespace id: both may be reused by unrelated processes later.
        w.proc = None
        w.ns = None
        return sorted(killed)

    def stop(self) -> None:
        """Kill every process of the cluster (workers with their executors, then the master).
        The private tmpfs mounts go away with their namespaces. Safe to call twice."""
        errors = []
        for w in self._workers:
            try:
                self.kill_worker(w.index)
            except Exception as e:  # keep going: the master must die too
                errors.append(e)
        if self._master is not None:
            try:
                os.killpg(self._master.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self._master.wait(10)
            except subprocess.TimeoutExpired:
                errors.append(ClusterError(f"master pid {self._master.pid} did not die"))
            self._master = None
        for f in self._files:
            try:
                f.close()
            except OSError:
                pass
        self._files.clear()
        if errors:
            raise errors[0]

    # -- internals -------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(self.spark_home),
            SPARK_CONF_DIR=str(self.root / "conf"),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_HOSTNAME="127.0.0.1",
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            SPARK_DAEMON_MEMORY="256m",
            # The master's and workers' JVMs live for one test module: C2 would compile for
            # most of it (tests/servers/spark_cds.py).
            SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1",
            # A taken port is an error (and a retry with new ports), not a silent port+1 that
            # master_url and the worker bookkeeping would not know about.
            SPARK_MASTER_OPTS="-Dspark.port.maxRetries=0",
            SPARK_WORKER_OPTS="-Dspark.port.maxRetries=0",
            PYTHONUNBUFFERED="1",
        )
        return env

    def _popen(self, cmd: list[str], log: Path, **env: str) -> subprocess.Popen:
        f = open(log, "ab")
        self._files.append(f)
        if shutil.which("setpriv"):
            # Dies with the process that started it, even if that one is SIGKILLed and never
            # runs stop(); a worker's executors follow their worker (Spark's WorkerWatcher).
            cmd = ["setpriv", "--pdeathsig", "KILL", *cmd]
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**self.env(), **env}, cwd=self.root, start_new_session=True)

    def _spark_class(self) -> str:
        return str(self.spark_home / "bin" / "spark-class")

    def _start_master(self) -> None:
        self.master_port = free_port()
        self.master_webui_port = free_port()
        cmd = [self._spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
               "--port", str(self.master_port), "--webui-port", str(self.master_webui_port)]
        self._master = self._popen(cmd, self.logs / "master.log")

    def _wait_for_master(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            self._check_running()
            try:
                if self.master_state().get("status") == "ALIVE":
                    return
            except Exception:
                pass
            time.sleep(0.3)
        raise ClusterError(f"Spark master did not come up in {self.start_timeout:.0f}s\n" + self._log_tails())

    def _spawn_worker(self, w: _Worker) -> None:
        w.webui_port = free_port()
        work = self.worker_dir(w.index)
        work.mkdir(parents=True, exist_ok=True)
        w.log = self.logs / f"worker-{w.index}.log"
        spark = [self._spark_class(), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(w.webui_port),
                 "--work-dir", str(work), self.master_url]
        # A private mount namespace whose tmpfs at state_path nobody else sees; `exec` keeps
        # the worker JVM at the Popen pid (the process-group leader).
        script = 'mount -t tmpfs -o "size=$1,mode=0700" tmpfs "$2" && shift 2 && exec "$@"'
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", self.tmpfs_size,
               str(self.state_path), *spark]
        # Executors' scratch space (shuffle, blocks) under the worker too, not in /tmp where a
        # SIGKILLed worker would leave it behind.
        local = self.root / f"worker-{w.index}" / "local"
        local.mkdir(parents=True, exist_ok=True)
        w.proc = self._popen(cmd, w.log, SPARK_LOCAL_DIRS=str(local))
        # The namespace is created at once by unshare; remember it to find the executors later.
        deadline = time.monotonic() + 10
        own = _mnt_ns(os.getpid())
        while time.monotonic() < deadline:
            ns = _mnt_ns(w.proc.pid)
            if ns is not None and ns != own:
                w.ns = ns
                return
            if w.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise ClusterError(f"worker {w.index} did not enter its own mount namespace (exit code "
                           f"{w.proc.poll()})\n" + _tail(w.log))

    def _members(self, w: _Worker) -> set[int]:
        """Live pids in w's namespace, in its process group, or descended from it."""
        if w.proc is None and w.ns is None:
            return set()
        root = w.proc.pid if w.proc is not None else None
        stats = {}
        for pid in all_pids():
            st = proc_stat(pid)
            if st is not None and st[0] not in ("Z", "X"):
                stats[pid] = st
        members = set()
        for pid, (_, _, pgid) in stats.items():
            if pid == root or (root is not None and pgid == root) or (w.ns is not None and _mnt_ns(pid) == w.ns):
                members.add(pid)
        grew = True
        while grew:  # descendants (a child that made its own session/group and namespace)
            grew = False
            for pid, (_, ppid, _) in stats.items():
                if ppid in members and pid not in members:
                    members.add(pid)
                    grew = True
        members.discard(os.getpid())
        return members

    def _check_running(self) -> None:
        if self._master is not None and self._master.poll() is not None:
            raise ClusterError(f"Spark master exited with {self._master.returncode}\n" + self._log_tails())
        for w in self._workers:
            if w.proc is not None and w.proc.poll() is not None:
                raise ClusterError(f"Spark worker {w.index} exited with {w.proc.returncode}\n" + self._log_tails())

    def _log_tails(self) -> str:
        parts = [_tail(self.logs / "master.log")]
        parts += [_tail(w.log) for w in self._workers if w.log is not None]
        return "\n".join(parts)


def spark_conf(cluster: StandaloneCluster) -> dict[str, str]:
    """Spark conf that makes the small cluster usable on a 2-core machine: one 1-core, 512 MB
    executor per worker, and the first stage waits until every worker's executor registered
    (so work is spread over all workers from the start)."""
    return {
        "spark.executor.memory": "512m",
        "spark.executor.cores": str(cluster.cores),
        "spark.cores.max": str(cluster.cores * cluster.n_workers),
        "spark.driver.memory": "1g",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
        "spark.executorEnv.PYTHONUNBUFFERED": "1",
        # An executor lives as long as its test's application: the client compiler alone
        # (tests/servers/spark_cds.py says why for the job processes' drivers).
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    }


def spark_settings(cluster: StandaloneCluster, **extra_conf: str) -> list[str]:
    """`--set` values that make a sparkpoint job run on `cluster`. `spark.conf` is one key
    whose value is a map (given as a YAML/JSON flow mapping), so pass any further Spark conf
    via `extra_conf` (keys with dots: `**{"spark.task.maxFailures": "8"}`) rather than a
    second `spark.conf=` (the later one would replace this one)."""
    conf = {**spark_conf(cluster), **{k: str(v) for k, v in extra_conf.items()}}
    return [f"spark.master={cluster.master_url}", "spark.conf=" + json.dumps(conf)]
