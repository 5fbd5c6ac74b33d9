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
main thread, which owns the epoch loop: a request is only queued here."""

from __future__ import annotations

import logging
import queue
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
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


class SavepointSteps:
    """JobMaster's savepoint and stop steps; they use the job's attributes (coordinator,
    gateway, settings, progress, _stop_requests)."""

    # ------------------------------------------------------------------ public
    def trigger_savepoint(self, target: str | None = None) -> Future:
        """Take a savepoint now, the job keeps running; the future completes with its path
        (or URL). Its output is committed by the next checkpoint, not by it."""
        log.info("savepoint requested%s", f" to {target}" if target else "")
        return self._savepoint_path(self.coordinator.trigger_savepoint(target))

    def _trigger_final_savepoint(self, target: str | None) -> Future:
        """The savepoint the job stops with: its completion commits the output."""
        log.info("stop with savepoint requested%s", f" to {target}" if target else "")
        return self._savepoint_path(self.coordinator.trigger_savepoint(target, terminate=True))

    def stop(self, savepoint: bool = True, target: str | None = None) -> Future:
        """Stop the job with a savepoint (its path is the future's result) or, with
        `savepoint=False`, with a last checkpoint (result None). Ends FINISHED."""
        fut: Future = Future()
        self._stop_requests.put(StopRequest(savepoint, target, fut))
        return fut

    def stop_with_savepoint(self, target: str | None = None, *, savepoint: bool | None = None) -> Future:
        """`stop()` as the REST API calls it: a target implies a savepoint."""
        return self.stop(savepoint=target is not None if savepoint is None else savepoint, target=target)

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
        """Runs a queued stop request, if any. True if the job stopped."""
        try:
            request: StopRequest = self._stop_requests.get_nowait()
        except queue.Empty:
            return False
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
        self.gateway.drain_commits()  # its output is committed before the job ends
        self.final_done = True
        url = fut.result() if request.savepoint else None
        self.stopped_with = url
        self.progress.announce(f"stopped with savepoint {url}" if url else
                               "stopped with a last checkpoint; its output is committed")
        request.future.set_result(url)
        return True
