"""Savepoints and stopping a job (`SavepointControl`, held by the JobMaster).

- `trigger_savepoint(target)`: a forced checkpoint whose barrier epoch also copies each
  subtask's state files into the savepoint directory (on the executors), then
  `_metadata` there (storage/savepoints.py). The job keeps running, and the savepoint
  commits nothing (Flink's rule): a failover restores the job's latest checkpoint and
  replays the epochs after it, so output the savepoint had published would be
  published again. What it staged is committed by the next checkpoint.
- `stop(savepoint=..., target=...)`: Flink's stop-with-savepoint. Periodic checkpoints
  stop, sources read nothing more, a savepoint (or, without one, a last checkpoint) is
  taken at the current positions with barriers carried by empty epochs (no final
  watermark: windows still open stay open in the savepoint), its output is committed,
  and the job ends FINISHED. If the savepoint fails the job keeps running, as Flink's.

Both are asked from any thread (REST handlers, the control thread) and run on the
main thread, which owns the epoch loop: a request is only queued here. A stop is never
dropped: one whose epoch fails goes back to the head of the queue and is carried out
after the restore (an empty epoch first brings the restored state up), and one the job
ends before is answered with how it ended (`SavepointControl.settle`).

A savepoint copies all of the job's state, so a target must lie below the checkpoint
directory or below one of `execution.checkpointing.savepoint.allowed-targets`
(`check_target`): a request cannot send the state to an http:// URL or another disk.
Every way to ask goes through the one check (`SavepointControl.check_target`) in the
JobMaster's `trigger_savepoint` and `stop`: the REST API (hence the CLI) and Python code
alike, which may be a notebook or an operator's script rather than the pipeline's
author."""

from __future__ import annotations

import logging
import os
import posixpath
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable
from urllib.parse import urlsplit

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.errors import ConfigError
from sparkpoint.redaction import mask_url
from sparkpoint.runtime.gateway import Barrier
from sparkpoint.runtime.failures import summarize as _summary
from sparkpoint.runtime.status import JobStatus, JobStatusTracker

log = logging.getLogger("sparkpoint.runtime.jobmaster")


@dataclass
class StopRequest:
    savepoint: bool
    target: str | None
    future: Future


def one_savepoint_at_a_time() -> Callable[[Barrier], bool]:
    """For `gateway.take_barriers`: every checkpoint barrier and the oldest savepoint
    barrier. An epoch copies state files to one savepoint target, and a savepoint is
    never subsumed (the coordinator ignores a SUBSUMED decline of one), so later
    savepoints stay queued for the next epochs."""
    oldest: list[int] = []

    def carried_now(barrier: Barrier) -> bool:
        if not barrier.properties.savepoint:
            return True
        if not oldest:
            oldest.append(barrier.checkpoint_id)
        return barrier.checkpoint_id == oldest[0]

    return carried_now


def savepoint_identity(data: CompletedCheckpointData) -> str:
    """What a checkpoint taken after starting from a savepoint records about it, so a
    rerun with the same `--from-savepoint` resumes from the job's own checkpoints."""
    return f"{data.job_name}/{data.checkpoint_id}@{data.completion_timestamp_ms}"


def _place(url: str) -> tuple[str, str, str] | None:
    """(scheme, location, normalized path) of a path or URL; None if it cannot be judged
    (a query, a fragment, `..` in a URL)."""
    parts = urlsplit(url)
    if len(parts.scheme) <= 1 or parts.scheme == "file":  # a local path (or C:\...)
        local = parts.path if parts.scheme == "file" else url
        return "file", "", os.path.realpath(os.path.expanduser(local))
    if parts.query or parts.fragment or ".." in parts.path.split("/"):
        return None
    return parts.scheme.lower(), parts.netloc, posixpath.normpath("/" + parts.path.lstrip("/"))


def check_target(target: str, checkpoint_dir: str, allowed: list[str]) -> None:
    """ConfigError unless `target` lies below the checkpoint directory or an allowed place."""
    place = _place(target)
    if place is not None:
        for root in [checkpoint_dir, *allowed]:
            base = _place(root)
            if base is not None and place[:2] == base[:2] and (
                    place[2] == base[2] or place[2].startswith(base[2].rstrip("/") + "/")):
                return
    raise ConfigError(
        f"savepoint target {mask_url(target)} is refused: a savepoint copies all of the job's state, so it goes "
        f"below the checkpoint directory ({mask_url(checkpoint_dir)}) or below a place listed in "
        f"execution.checkpointing.savepoint.allowed-targets ({', '.join(map(mask_url, allowed)) or 'none set'})")


class StopOutcome(Enum):
    """What serving the stop queue came to."""
    KEEP_RUNNING = "keep running"  # nothing was asked, or the stop's savepoint failed: the job runs on
    CANCELLED = "cancelled"  # the job was cancelled while the stop carried its barriers
    STOPPED = "stopped"  # stopped: the savepoint or last checkpoint is taken and its output committed


@dataclass(frozen=True)
class StopEpochs:
    """What carrying out a stop needs of the epoch loop (the JobMaster's)."""
    # Run empty epochs carrying barriers until done(); False if the job was cancelled first.
    carry_barriers_until: Callable[..., bool]
    # Commit the final checkpoint's output (retried); False if the job was cancelled first.
    commit_final: Callable[[], bool]


def savepoint_path(fut: Future, job_name: str) -> Future:
    """A future of the savepoint's path (or URL) from the coordinator's future of its metadata."""
    out: Future = Future()

    def done(f: Future) -> None:
        error = f.exception()
        if error is not None:
            out.set_exception(error)
            return
        data = f.result()
        url = (data.handles.get("job") or {}).get("savepoint")
        log.info("savepoint %d of job %s completed: %s", data.checkpoint_id, job_name, url)
        out.set_result(url)

    fut.add_done_callback(done)
    return out


class SavepointControl:
    """Stop requests and savepoint targets. Requests come from any thread; `serve` runs
    on the main thread, between epochs."""

    def __init__(self, job_name: str, settings: Any, status: JobStatusTracker, stopped: threading.Event):
        self.job_name = job_name
        self.settings = settings
        self.status = status
        self.stopped = stopped  # set once the job must stop acting (cancelled, or over)
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.stopped_with: str | None = None  # the savepoint the job stopped with

    # ------------------------------------------------------------------ any thread
    def check_target(self, target: str | None) -> None:
        """ConfigError (one line naming the allowed places) unless `target` is one; None
        is the job's own savepoint directory."""
        if target is not None:
            check_target(target, self.settings.checkpoint_dir, self.settings.savepoint_allowed_targets)

    def request_stop(self, savepoint: bool, target: str | None) -> Future:
        """Queue a stop; ConfigError, before anything is queued, for a target outside the allowed places."""
        if savepoint:
            self.check_target(target)
        fut: Future = Future()
        self.requests.put(StopRequest(savepoint, target, fut))
        return fut

    # ------------------------------------------------------------------ main thread
    def waiting(self, signal_stop: Future | None = None) -> bool:
        """A stop is asked for and not carried out yet."""
        return not self.requests.empty() or (signal_stop is not None and not signal_stop.done())

    def serve(self, coordinator: Any, progress: Any, epochs: StopEpochs) -> StopOutcome:
        """Runs a queued stop request, if any.

        If an epoch fails while the stop carries its barriers, the failure propagates
        (the job fails over) and the request goes back to the head of the queue: the
        stop is still asked for, and is carried out after the restore."""
        try:
            request: StopRequest = self.requests.get_nowait()
        except queue.Empty:
            return StopOutcome.KEEP_RUNNING
        try:
            return self._carry_out(request, coordinator, progress, epochs)
        except BaseException:
            if not request.future.done():
                self.requeue(request)
            raise

    def requeue(self, request: StopRequest) -> None:
        """`request` first in the queue again (unless it is there), the others after it."""
        waiting = []
        while True:
            try:
                waiting.append(self.requests.get_nowait())
            except queue.Empty:
                break
        if not any(r.future is request.future for r in waiting):
            waiting.insert(0, request)
        for r in waiting:
            self.requests.put(r)

    def settle(self, error: BaseException | None = None) -> None:
        """The job is over: every stop asked for and not carried out gets its answer, never
        silence (a REST caller polls its operation until it has one). A stop without a
        savepoint is done when the job FINISHED (its final checkpoint committed the
        output); anything else fails, saying how the job ended. `error`: what ended it."""
        status = self.status.status
        why = f": {_summary(error)}" if error is not None else ""
        # Nothing acts on a stop any more (a signal's stop that fails here would otherwise
        # log that it cancels the job, which has already ended).
        self.stopped.set()
        while True:
            try:
                request: StopRequest = self.requests.get_nowait()
            except queue.Empty:
                return
            if request.future.done():
                continue
            if status is JobStatus.FINISHED and not request.savepoint:
                request.future.set_result(None)
                continue
            if status is JobStatus.FINISHED:
                line = (f"job {self.job_name} finished (its input ended) before the stop with a savepoint was "
                        f"taken: no savepoint; its output is committed by its final checkpoint")
            else:
                what = "a savepoint" if request.savepoint else "a last checkpoint"
                line = f"job {self.job_name} ended {status.value} before it could stop with {what}{why}"
            request.future.set_exception(RuntimeError(line))

    def _carry_out(self, request: StopRequest, coordinator: Any, progress: Any, epochs: StopEpochs) -> StopOutcome:
        what = "a savepoint" if request.savepoint else "a last checkpoint"
        progress.announce(f"stopping with {what}: sources read nothing more")
        coordinator.stop_scheduler()
        if request.savepoint:  # the savepoint the job stops with: its completion commits the output
            log.info("stop with savepoint requested%s", f" to {mask_url(request.target)}" if request.target else "")
            fut = savepoint_path(coordinator.trigger_savepoint(request.target, terminate=True), self.job_name)
        else:
            fut = coordinator.trigger_checkpoint(forced=True)
        if not epochs.carry_barriers_until(fut.done, final=False):
            request.future.set_exception(RuntimeError("the job was cancelled before the stop completed"))
            return StopOutcome.CANCELLED
        error = fut.exception()
        if error is not None:
            log.warning("stop of job %s with %s failed: %s; the job keeps running", self.job_name, what,
                        _summary(error))
            if self.settings.checkpointing_enabled:
                coordinator.start_scheduler()
            else:
                coordinator.resume()
            request.future.set_exception(error)
            return StopOutcome.KEEP_RUNNING
        # Its output is committed before the job ends (retried; a failover if it cannot be).
        if not epochs.commit_final():
            request.future.set_exception(RuntimeError("the job was cancelled before the stop's output was committed"))
            return StopOutcome.CANCELLED
        url = fut.result() if request.savepoint else None
        self.stopped_with = url
        progress.announce(f"stopped with savepoint {url}" if url else
                          "stopped with a last checkpoint; its output is committed")
        request.future.set_result(url)
        return StopOutcome.STOPPED
