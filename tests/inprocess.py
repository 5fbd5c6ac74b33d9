"""Crash a real job and restore it, inside the test process, on the shared SparkSession.

A test starts a JobMaster (`start`) on a background thread, lets it die at a chosen
moment as a crash would (`CrashPoint`, or `Run.crash()` from the test), and starts the
same job again on the same directories (`restart`): no Spark start per run, so a
restore scenario costs seconds instead of a process and a JVM.

What "crash" means here
-----------------------
A crash is the moment after which nothing the run does reaches anything durable. The
harness cuts every seam through which the driver changes the world, at once:

    checkpoint storage   a StorageFS wrapper (the wrapper seam storage faults use):
                         every operation after the crash raises RunCrashed
    the sinks            a wrapper each: no staging, pre-commit, commit or abort after it
    participants         the asynchronous part of a checkpoint is observed through a
                         ParticipantFaults wrapper (a crash point may fire there)

Then the run is cancelled and unwinds on its own thread. Its clean-up finds the seams
dead: the lease is not released (it expires, as after a kill), no pending checkpoint
directory is deleted, no staged output is committed or aborted, no final checkpoint is
taken. Its threads and its REST server stop (a test process must not leak them), and
`restart` proves the crashed run left no sparkpoint thread behind.

What a crash leaves that this does not simulate, and why that is the right model:
- Spark's executors survive. On a cluster a driver's crash leaves them running until
  the application is torn down, and a task in flight may still finish its change-log
  upload or stage its output; here the epoch in flight finishes the same way. Their
  Python workers keep the stores they kept open (kept_stores.py): a restarted driver
  mints a new generation, so such a store is never used (store_opening.py), which is
  what this exercises. A process that dies with its workers (local mode, SIGKILL) is
  covered by the SIGKILL tests in tests/e2e.
- The lease is taken over by expiry (the path a run on another host takes): the
  crashed run had the test process's own pid, so "its process is gone" cannot be
  proven here; `restart` waits for the lease to expire (a short ttl, DEFAULTS).
- Files the runtime writes outside the seams (the failure trace under
  `<checkpoint-dir>/<job>/failures/`) may still appear after the crash point.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from unittest import mock

from sparkpoint.config import Settings
from sparkpoint.errors import StorageError
from sparkpoint.faults import FaultOp, FaultyStorageFS
from sparkpoint.runtime import storage_setup
from sparkpoint.runtime.jobmaster import JobResult
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout, checkpoint_id_in_path
from sparkpoint.storage.lease import read_current_lease
from tests.integration.failure_support import ObservedJob

# Short enough that a restart waits little for the crashed run's lease to expire, long
# enough that a loaded machine does not lapse it (heartbeats every ttl/4).
LEASE_TTL = "3 s"

DEFAULTS: dict[str, Any] = {
    "execution.checkpointing.interval": "1 s",
    "parallelism.default": 2,
    "sparkpoint.progress": False,
    "rest.enabled": False,
    "sparkpoint.lease.ttl": LEASE_TTL,
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.delay": "100 ms",
    # Epochs are never cut by time: the oracles fold epochs of the sources' own sizes, and
    # on a loaded machine an epoch can outlast the sizer's ceiling (a quarter of the
    # checkpoint timeout), which cuts the next ones smaller.
    "sparkpoint.epoch.max-duration": 0,
}


def job_settings(root: Path, name: str, **overrides: Any) -> Settings:
    """Settings of a job under `root` (checkpoints/, state/), with the harness's defaults."""
    return Settings.load(overrides={
        "pipeline.name": name,
        "execution.checkpointing.dir": str(root / "checkpoints"),
        "state.local.dir": str(root / "state"),
        **DEFAULTS,
        **overrides,
    })


class RunCrashed(StorageError):
    """What a seam raises once its run has crashed: nothing it asks for happens."""


# -- where a run dies ---------------------------------------------------------------------

@dataclass(frozen=True)
class SeamEvent:
    """Something the run did through a seam: `seam` is "storage", "sink" or "async-part";
    `what` the operation (a FaultOp value, a sink method, "started"); `after`: it
    completed (False: it is about to happen, and will not if the run dies now)."""

    seam: str
    what: str
    after: bool
    path: str = ""  # storage
    epoch: int | None = None  # sink staging
    checkpoint_id: int | None = None
    participant: str = ""  # async-part


class CrashPoint:
    """Where a run dies: the first seam event `matches` accepts (`completed` is how
    many checkpoints this run has completed so far, counted at the storage seam)."""

    def __init__(self, description: str, matches: Callable[[SeamEvent, int], bool]):
        self.description = description
        self._matches = matches

    def matches(self, event: SeamEvent, completed: int) -> bool:
        return self._matches(event, completed)

    def __repr__(self) -> str:
        return f"CrashPoint({self.description})"

    @classmethod
    def after_epoch(cls, epoch: int) -> "CrashPoint":
        """Once the sink staged epoch `epoch` (before any checkpoint carries it)."""
        return cls(f"after epoch {epoch} was staged",
                   lambda e, _: e.seam == "sink" and e.after and e.what in ("stage_epoch", "write_epoch")
                   and e.epoch == epoch)

    @classmethod
    def after_metadata(cls, nth: int = 1) -> "CrashPoint":
        """Right after the `nth` checkpoint's `_metadata` is durable and before its staged
        output is committed (the two-phase commit's window)."""
        return cls(f"after checkpoint #{nth}'s _metadata, before its commit",
                   lambda e, done: _is_checkpoint_metadata(e) and e.after and done >= nth)

    @classmethod
    def during_async_part(cls, after_completed: int = 1) -> "CrashPoint":
        """While a state subtask's asynchronous part of a checkpoint runs, once
        `after_completed` checkpoints completed (pair with a `slow_ack` fault so the
        part is in flight long enough for the run to be doing something else)."""
        return cls(f"during an asynchronous part, after {after_completed} completed checkpoint(s)",
                   lambda e, done: e.seam == "async-part" and done >= after_completed)

    @classmethod
    def before_savepoint_metadata(cls) -> "CrashPoint":
        """A savepoint's state files are copied, its `_metadata` is not written yet."""
        return cls("before a savepoint's _metadata",
                   lambda e, _: e.seam == "storage" and not e.after and e.what == FaultOp.CREATE_EXCLUSIVE.value
                   and e.path.endswith("/_metadata") and checkpoint_id_in_path(e.path) is None)


def _is_checkpoint_metadata(e: SeamEvent) -> bool:
    return (e.seam == "storage" and e.what == FaultOp.CREATE_EXCLUSIVE.value and e.path.endswith("/_metadata")
            and checkpoint_id_in_path(e.path) is not None)


class CrashSwitch:
    """One run's life: alive until a crash point fires or the test crashes it."""

    def __init__(self, crash_at: CrashPoint | None = None):
        self.crash_at = crash_at
        self._lock = threading.Lock()
        self._dead = threading.Event()
        self.where: str | None = None
        self.completed = 0  # checkpoints whose _metadata this run wrote
        self._on_crash: list[Callable[[], None]] = []

    @property
    def crashed(self) -> bool:
        return self._dead.is_set()

    def on_crash(self, fn: Callable[[], None]) -> None:
        self._on_crash.append(fn)

    def check(self, what: str) -> None:
        if self._dead.is_set():
            raise RunCrashed(f"this run crashed ({self.where}): {what} never happens")

    def observe(self, event: SeamEvent) -> None:
        """Called by the seams; dies here if the crash point matches."""
        with self._lock:
            if self._dead.is_set():
                return
            if event.after and _is_checkpoint_metadata(event):
                self.completed += 1
            fire = self.crash_at is not None and self.crash_at.matches(event, self.completed)
        if fire:
            self.crash(f"{self.crash_at.description} ({event.seam} {event.what} {event.path or ''})".rstrip())
            raise RunCrashed(f"this run crashed: {self.where}")

    def crash(self, where: str) -> None:
        with self._lock:
            if self._dead.is_set():
                return
            self.where = where
            self._dead.set()
        for fn in self._on_crash:
            fn()

    def wait(self, timeout: float) -> bool:
        return self._dead.wait(timeout)


# -- the seams ----------------------------------------------------------------------------

class CrashingStorageFS(FaultyStorageFS):
    """Checkpoint storage that stops existing for the run once it crashed. A FaultyStorageFS
    without rules: its `_inject` runs before every operation."""

    _WRITES = {"makedirs": FaultOp.MKDIR, "put_file": FaultOp.UPLOAD, "write_atomic": FaultOp.WRITE,
               "create_exclusive": FaultOp.CREATE_EXCLUSIVE, "rm": FaultOp.DELETE}

    def __init__(self, inner: StorageFS, switch: CrashSwitch):
        super().__init__(inner)
        self.switch = switch

    def _inject(self, op: FaultOp, path: str):
        self.switch.check(f"{op.value} of {path}")
        self.switch.observe(SeamEvent("storage", op.value, False, path=path,
                                      checkpoint_id=checkpoint_id_in_path(path)))
        return super()._inject(op, path)

    def _after(self, op: FaultOp, path: str) -> None:
        self.switch.observe(SeamEvent("storage", op.value, True, path=path, checkpoint_id=checkpoint_id_in_path(path)))

    def makedirs(self, path: str) -> None:
        super().makedirs(path)
        self._after(FaultOp.MKDIR, path)

    def put_file(self, local_path: str, path: str) -> None:
        super().put_file(local_path, path)
        self._after(FaultOp.UPLOAD, path)

    def write_atomic(self, path: str, data: bytes) -> None:
        super().write_atomic(path, data)
        self._after(FaultOp.WRITE, path)

    def create_exclusive(self, path: str, data: bytes) -> None:
        super().create_exclusive(path, data)
        self._after(FaultOp.CREATE_EXCLUSIVE, path)

    def rm(self, path: str, recursive: bool = False) -> None:
        super().rm(path, recursive=recursive)
        self._after(FaultOp.DELETE, path)


class CrashingSink:
    """The pipeline's sink, cut off once the run crashed: what it staged stays staged."""

    _GUARDED = ("stage_epoch", "write_epoch", "pre_commit", "commit", "abort", "recover", "savepoint_handle",
                "use_savepoint")

    def __init__(self, inner: Any, switch: CrashSwitch):
        self._inner = inner
        self._switch = switch

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name not in self._GUARDED:
            return value

        def guarded(*args: Any, **kwargs: Any) -> Any:
            self._switch.check(f"sink {name}")
            result = value(*args, **kwargs)
            epoch = args[0] if name in ("stage_epoch", "write_epoch") else None
            self._switch.observe(SeamEvent("sink", name, True, epoch=epoch))
            return result

        return guarded


class CrashingParticipantFaults:
    """The job's participant faults, with the start of every asynchronous part observed."""

    def __init__(self, inner: Any, switch: CrashSwitch):
        self._inner = inner
        self._switch = switch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def before_async(self, participant: str, checkpoint_id: int, cancel: threading.Event) -> None:
        self._switch.check(f"the asynchronous part of {participant}")
        self._switch.observe(SeamEvent("async-part", "started", False, checkpoint_id=checkpoint_id,
                                       participant=participant))
        self._inner.before_async(participant, checkpoint_id, cancel)


# -- a run --------------------------------------------------------------------------------

class _Lines:
    """A stream (for the progress announcements) and a logging handler in one: every line
    the run writes, in order, for `wait_for` and assertions."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._partial = ""
        self.handler = _Handler(self)

    def write(self, text: str) -> int:
        with self._cond:
            self._partial += text
            *done, self._partial = self._partial.split("\n")
            self.lines.extend(done)
            self._cond.notify_all()
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def add(self, line: str) -> None:
        with self._cond:
            self.lines.append(line)
            self._cond.notify_all()


class _Handler(logging.Handler):
    def __init__(self, lines: _Lines):
        super().__init__(logging.INFO)
        self._lines = lines
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.add(self.format(record))
        except Exception:  # noqa: BLE001 - a log line must never break the run
            pass


class HarnessJob(ObservedJob):
    """The JobMaster a Run drives: the user's job, with its seams wrapped."""

    def __init__(self, pipeline, settings: Settings, spark, switch: CrashSwitch, lines: _Lines):
        super().__init__(pipeline, settings, spark=spark)
        self.switch = switch
        self._lines = lines
        self.sinks = {name: CrashingSink(sink, switch) for name, sink in self.sinks.items()}
        self.sink = next(iter(self.sinks.values()))
        self.faults = CrashingParticipantFaults(self.faults, switch)

    def _setup(self) -> None:
        real_open = storage_setup._open

        def open_wrapped(*args: Any, wrap_fs: Callable[[StorageFS], StorageFS] | None = None, **kwargs: Any):
            def wrap(fs: StorageFS) -> StorageFS:
                return CrashingStorageFS(wrap_fs(fs) if wrap_fs is not None else fs, self.switch)
            return real_open(*args, wrap_fs=wrap, **kwargs)

        with mock.patch.object(storage_setup, "_open", open_wrapped):
            super()._setup()
        self.progress.stream, self.progress.tty = self._lines, False


class Run:
    """One run of a job on its own thread: it ends on its own, or dies at its crash point
    or at `crash()`."""

    def __init__(self, pipeline, settings: Settings, spark, crash_at: CrashPoint | None = None):
        self.settings = settings
        self.switch = CrashSwitch(crash_at)
        self._out = _Lines()
        self.job = HarnessJob(pipeline, settings, spark, self.switch, self._out)
        self.switch.on_crash(self.job.cancel)
        self.result: JobResult | None = None
        self.error: BaseException | None = None
        self._threads_before = set(threading.enumerate())
        self._thread = threading.Thread(target=self._main, name=f"inprocess-run-{settings.job_name}", daemon=True)
        self._logger = logging.getLogger("sparkpoint")
        self._level = self._logger.level
        self._logger.addHandler(self._out.handler)
        if self._logger.getEffectiveLevel() > logging.INFO:
            self._logger.setLevel(logging.INFO)
        _live.add(self)
        self._thread.start()

    def _main(self) -> None:
        try:
            self.result = self.job.run()
        except BaseException as e:  # noqa: BLE001 - reported by wait() / crash()
            self.error = e

    # -- observing ------------------------------------------------------------------
    @property
    def lines(self) -> list[str]:
        with self._out._cond:
            return list(self._out.lines)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.lines[-n:])

    def count(self, pattern: str) -> int:
        rx = re.compile(pattern)
        return sum(1 for line in self.lines if rx.search(line))

    def wait_for(self, pattern: str, timeout: float = 120, start_at: int = 0) -> re.Match:
        """The first line from `start_at` on that matches; fails if the run ended first."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        i = start_at
        with self._out._cond:
            while True:
                while i < len(self._out.lines):
                    m = rx.search(self._out.lines[i])
                    if m:
                        return m
                    i += 1
                if not self._thread.is_alive() or self.switch.crashed:
                    raise AssertionError(f"the run ended ({self._ending()}) before /{pattern}/:\n{self._tail_locked()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for /{pattern}/:\n{self._tail_locked()}")
                self._out._cond.wait(min(left, 0.2))

    def _tail_locked(self) -> str:
        return "\n".join(self._out.lines[-60:])

    def _ending(self) -> str:
        if self.switch.crashed:
            return f"crashed: {self.switch.where}"
        return f"error: {self.error!r}" if self.error is not None else "ended"

    # -- ending ---------------------------------------------------------------------
    def wait(self, timeout: float = 300) -> JobResult:
        """The run's result once it ended on its own; raises what the run raised."""
        self._join(timeout)
        if self.switch.crashed:
            raise AssertionError(f"the run crashed ({self.switch.where}):\n{self.tail()}")
        if self.error is not None:
            raise self.error
        return self.result

    def wait_crashed(self, timeout: float = 300) -> "Run":
        """Until the crash point fired and the dead run has unwound."""
        if not self.switch.wait(timeout):
            self.crash("the crash point was not reached in time")
            raise AssertionError(f"the crash point {self.switch.crash_at} was not reached in "
                                 f"{timeout:.0f} s:\n{self.tail()}")
        self._join(timeout)
        return self

    def crash(self, where: str = "crashed by the test") -> "Run":
        """Crash the run now (if it is still alive) and wait until it has unwound."""
        self.switch.crash(where)
        self._join(300)
        return self

    def _join(self, timeout: float) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.switch.crash("did not end in time")
            self._thread.join(60)
            raise AssertionError(f"the run did not end in {timeout:.0f} s:\n{self.tail()}")
        _live.discard(self)
        self._logger.removeHandler(self._out.handler)
        self._logger.setLevel(self._level)
        rest = getattr(self.job, "rest", None)
        serving = getattr(rest, "_thread", None)
        if serving is not None and serving.is_alive():  # a crashed run's clean-up may stop before closing it
            rest.close(linger_s=0)
        self._assert_no_threads_left()

    def _assert_no_threads_left(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = [t for t in threading.enumerate() if t not in self._threads_before and t.is_alive()
                    and t is not self._thread and _ours(t)]
            if not left:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the run left threads behind: {[t.name for t in left]}")
            time.sleep(0.05)


_live: set[Run] = set()


def crash_leftovers() -> None:
    """Crash every run a failed test left running, so it cannot hold the shared session
    (tests/integration/conftest.py calls this after each test)."""
    for run in list(_live):
        try:
            run.crash("left running by its test")
        except AssertionError:
            pass  # the test already failed; its run is stopped either way


def _ours(thread: threading.Thread) -> bool:
    """Threads the runtime starts (Spark's and py4j's own are the session's)."""
    return thread.name.startswith(("sparkpoint", "checkpoint-", "inprocess-"))


def start(pipeline, settings: Settings, spark, crash_at: CrashPoint | None = None) -> Run:
    """Run `pipeline` on `spark` in this process; dies at `crash_at` if given."""
    return Run(pipeline, settings, spark, crash_at)


def restart(crashed: Run, pipeline, spark, settings: Settings | None = None,
            crash_at: CrashPoint | None = None) -> Run:
    """The same job again on the same directories, after `crashed` died: waits until its
    lease expired (no run on another host could take over sooner), then starts. Settings
    default to the crashed run's (pass others for a rescale, a savepoint to start from)."""
    assert crashed.switch.crashed, "restart() follows a crash; start() a run that ended on its own"
    settings = settings if settings is not None else crashed.settings
    wait_for_lease_expiry(settings)
    return Run(pipeline, settings, spark, crash_at)


def wait_for_lease_expiry(settings: Settings, timeout: float = 60) -> None:
    """Until no live lease holds the job (a crashed holder's expired)."""
    fs = StorageFS.from_url(settings.checkpoint_dir, settings.storage_options)
    layout = JobLayout(f"{fs.root}/{settings.job_name}")
    deadline = time.monotonic() + timeout
    while True:
        try:
            record = read_current_lease(fs, layout)
        except FileNotFoundError:
            return
        now_ms = int(time.time() * 1000)
        if record is None or not record.is_live(now_ms):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the lease of {settings.job_name} did not expire in {timeout:.0f} s: {record}")
        time.sleep(min(0.5, (record.expires_at_ms - now_ms) / 1000 + 0.05))
