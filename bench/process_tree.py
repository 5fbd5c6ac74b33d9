"""CPU seconds and peak memory of a process tree (a benchmark's driver, the JVM it starts,
Spark's Python workers, or a child process and its descendants), read from /proc.
Standard library only, so the PyFlink venv's scripts can import it too."""

from __future__ import annotations

import os
import threading

def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        tree.setdefault(ppid, []).append(int(name))
    return tree


def _pss_bytes(pid: int, page: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    with open(f"/proc/{pid}/statm") as f:  # no smaps_rollup (old kernel): RSS
        return int(f.read().split()[1]) * page


def tree_rss(root_pid: int | None = None) -> tuple[int, dict[str, list]]:
    """(memory in bytes, {process name: [count, MB]}) of `root_pid` (default: this
    process) and all its descendants (the Python driver, the JVM it launched, Spark's
    Python workers), as the sum of their PSS (proportional set size: a page shared by n
    processes counts 1/n in each), so the sum is the tree's resident memory. A plain sum
    of RSS would count the JVM twice whenever it forks a helper (between fork and exec
    the child shows the JVM's whole RSS) and forked Python workers' shared pages once
    per worker."""
    tree = _children()
    root = root_pid or os.getpid()
    todo, total, by_name = [root], 0, {}
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        todo.extend(tree.get(pid, ()))
        try:
            rss = _pss_bytes(pid, page)
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        # The root is the job's driver process; its Python children are Spark's workers.
        name = "driver" if pid == root else name
        total += rss
        entry = by_name.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] = round(entry[1] + rss / 2**20, 1)
    return total, by_name


def tree_cpu_s(root_pid: int | None = None) -> float:
    """CPU seconds (user + system) used so far by `root_pid` (default: this process) and
    its descendants, including descendants already reaped (their time is in their
    parent's cutime/cstime). Both cores are busy while a W1/W2 run runs, so throughput is
    CPU-bound: the difference over a run, per event, says how much each system spends."""
    tree = _children()
    todo, total = [root_pid or os.getpid()], 0
    while todo:
        pid = todo.pop()
        todo.extend(tree.get(pid, ()))
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def tree_cpu_by_part(root_pid: int | None = None) -> dict[str, float]:
    """CPU seconds so far of `root_pid` (default: this process) and its live descendants,
    by part: "driver" (the root), "python workers" (Spark's daemon and its workers), and
    each JVM by thread group ("jvm: C2 CompilerThread", "jvm: Executor task launch
    worker", ...: the thread's name without its number). Threads and processes that
    ended are not counted, so take differences over a window where they live on (Spark
    reuses its Python workers)."""
    import re

    tree, root = _children(), root_pid or os.getpid()
    ticks = os.sysconf("SC_CLK_TCK")
    todo, parts = [root], {}
    while todo:
        pid = todo.pop()
        todo.extend(tree.get(pid, ()))
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                cmd = f.read()
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        java = "java" in cmd.split("\0", 1)[0]
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if pid == root:
                part = "driver"
            elif java:
                part = "jvm: " + (re.sub(r"[\d#-]+$", "", comm).strip() or comm)
            else:
                part = "python workers"
            parts[part] = parts.get(part, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return parts


def tree_rss_bytes(root_pid: int | None = None) -> int:
    return tree_rss(root_pid)[0]


class PeakRss:
    """Polls the process tree's RSS every `interval_s` in a daemon thread; `reset()` at
    the start of a run, `peak_mb` at its end."""

    def __init__(self, interval_s: float = 0.2, root_pid: int | None = None):
        self.interval_s = interval_s
        self.root_pid = root_pid  # None: this process
        self._peak = 0
        self.breakdown: dict[str, list] = {}  # at the peak: {process name: [count, MB]}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="peak-rss", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample()
            except Exception:
                pass
            self._stop.wait(self.interval_s)

    def _sample(self) -> None:
        total, by_name = tree_rss(self.root_pid)
        if total >= self._peak:
            self._peak, self.breakdown = total, by_name

    def reset(self) -> None:
        self._peak = 0
        self._sample()

    @property
    def peak_mb(self) -> float:
        self._sample()
        return round(self._peak / 2**20, 1)

    def stop(self) -> None:
        self._stop.set()


class TreeSampler(PeakRss):
    """PeakRss of another process's tree (a child running a job) that also keeps the tree's
    last CPU-seconds reading: a child's descendants that exit without being waited for
    (the JVM of a finished `sparkpoint run`) take their CPU time with them, so the figure
    is the last sample before the tree ends, up to `interval_s` short of it."""

    def __init__(self, root_pid: int, interval_s: float = 0.2):
        self.cpu_s = 0.0
        super().__init__(interval_s, root_pid)

    def _sample(self) -> None:
        super()._sample()
        self.cpu_s = max(self.cpu_s, tree_cpu_s(self.root_pid))
