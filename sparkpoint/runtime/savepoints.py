"""Savepoints and stopping a job (part of JobMaster).

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
ends before is answered with how it ended (`_settle_stop_requests`).

A savepoint copies all of the job's state, so a target must lie below the checkpoint
directory or below one of `execution.checkpointing.savepoint.allowed-targets`
(`check_target`): a request cannot send the state to an http:// URL or another disk.
Every way to ask goes through the one check in `trigger_savepoint` and `stop`: the REST
API (hence the CLI) and Python code alike, which may be a notebook or an operator's
script rather than the pipeline's author."""

from __future__ import annotations

import logging
import os
import posixpath
import queue
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.errors import ConfigError
from sparkpoint.redaction import mask_url
from sparkpoint.runtime.gateway import Barrier
from sparkpoint.runtime.failures import summarize as _summary

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


class SavepointSteps:
    """JobMaster's savepoint and stop steps; they use the job's attributes (coordinator,
    gateway, settings, progress, _stop_requests)."""

    # ------------------------------------------------------------------ public
    def trigger_savepoint(self, target: str | None = None) -> Future:
        """Take a savepoint now, the job keeps running; the future completes with its path
        (or URL). Its output is committed by the next checkpoint, not by it. ConfigError
        for a target outside the checkpoint directory and the allowed targets."""
        self._check_savepoint_target(target)
        log.info("savepoint requested%s", f" to {mask_url(target)}" if target else "")
        return self._savepoint_path(self.coordinator.trigger_savepoint(target))

    def _trigger_final_savepoint(self, target: str | None) -> Future:
        """The savepoint the job stops with: its completion commits the output."""
        log.info("stop with savepoint requested%s", f" to {mask_url(target)}" if target else "")
        return self._savepoint_path(self.coordinator.trigger_savepoint(target, terminate=True))

    def stop(self, savepoint: bool = True, target: str | None = None) -> Future:
        """Stop the job with a savepoint (its path is the future's result) or, with
        `savepoint=False`, with a last checkpoint (result None). Ends FINISHED.
        ConfigError, before anything is queued, for a target outside the allowed places."""
        if savepoint:
            self._check_savepoint_target(target)
        fut: Future = Future()
        self._stop_requests.put(StopRequest(savepoint, target, fut))
        return fut

    def stop_with_savepoint(self, target: str | None = None, *, savepoint: bool | None = None) -> Future:
        """`stop()` as the REST API calls it: a target implies a savepoint."""
        return self.stop(savepoint=target is not None if savepoint is None else savepoint, target=target)

    def _check_savepoint_target(self, target: str | None) -> None:
        """ConfigError (one line naming the allowed places) unless `target` is one; None
        is the job's own savepoint directory."""
        if target is not None:
            check_target(target, self.settings.checkpoint_dir, self.settings.savepoint_allowed_targets)

    # ------------------------------------------------------------------ main thread
    def _savepoint_path(self, fut: Future) -> Future:
        out: Future = Future()

        def done(f: Future) -> None:
            error = f.exception()
            if error is not None:
                out.set_exception(error)
                return
            data = f.result()
            url = (data.handles.get("job") or {}).get("savepoint")
            log.info("savepoint %d of job %s completed: %s", data.checkpoint_id, self.job_name, url)
            out.set_result(url)

        fut.add_done_callback(done)
        return out

    def _serve_stop_request(self) -> bool:
        """Runs a queued stop request, if any. True if the job stopped.

        If an epoch fails while the stop carries its barriers, the failure propagates
        (the job fails over) and the request goes back to the head of the queue: the
        stop is still asked for, and is carried out after the restore."""
        try:
            request: StopRequest = self._stop_requests.get_nowait()
        except queue.Empty:
            return False
        try:
            return self._carry_out_stop(request)
        except BaseException:
            if not request.future.done():
                self._requeue_stop(request)
            raise

    def _stop_waiting(self) -> bool:
        """A stop is asked for and not carried out yet."""
        signal_stop = getattr(self, "_signal_stop", None)
        return not self._stop_requests.empty() or (signal_stop is not None and not signal_stop.done())

    def _requeue_stop(self, request: StopRequest) -> None:
        """`request` first in the queue again (unless it is there), the others after it."""
        waiting = []
        while True:
            try:
                waiting.append(self._stop_requests.get_nowait())
            except queue.Empty:
                break
        if not any(r.future is request.future for r in waiting):
            waiting.insert(0, request)
        for r in waiting:
            self._stop_requests.put(r)

    def _settle_stop_requests(self, error: BaseException | None = None) -> None:
        """The job is over: every stop asked for and not carried out gets its answer, never
        silence (a REST caller polls its operation until it has one). A stop without a
        savepoint is done when the job FINISHED (its final checkpoint committed the
        output); anything else fails, saying how the job ended. `error`: what ended it."""
        from sparkpoint.runtime.status import JobStatus

        status = self.status.status
        why = f": {_summary(error)}" if error is not None else ""
        # Nothing acts on a stop any more (a signal's stop that fails here would otherwise
        # log that it cancels the job, which has already ended).
        self._stop.set()
        while True:
            try:
                request: StopRequest = self._stop_requests.get_nowait()
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

    def _carry_out_stop(self, request: StopRequest) -> bool:
        what = "a savepoint" if request.savepoint else "a last checkpoint"
        self.progress.announce(f"stopping with {what}: sources read nothing more")
        self.coordinator.stop_scheduler()
        fut = (self._trigger_final_savepoint(request.target) if request.savepoint
               else self.coordinator.trigger_checkpoint(forced=True))
        if not self._carry_barriers_until(fut.done, final=False):
            request.future.set_exception(RuntimeError("the job was cancelled before the stop completed"))
            return True
        error = fut.exception()
        if error is not None:
            log.warning("stop of job %s with %s failed: %s; the job keeps running", self.job_name, what,
                        _summary(error))
            if self.settings.checkpointing_enabled:
                self.coordinator.start_scheduler()
            else:
                self.coordinator.resume()
            request.future.set_exception(error)
            return False
        # Its output is committed before the job ends (retried; a failover if it cannot be).
        if not self._commit_final():
            request.future.set_exception(RuntimeError("the job was cancelled before the stop's output was committed"))
            return True
        self.final_done = True
        url = fut.result() if request.savepoint else None
        self.stopped_with = url
        self.progress.announce(f"stopped with savepoint {url}" if url else
                               "stopped with a last checkpoint; its output is committed")
        request.future.set_result(url)
        return True
