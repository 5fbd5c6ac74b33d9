"""Savepoints and stopping a job (part of JobMaster).

- `trigger_savepoint(target)`: a forced checkpoint whose barrier epoch also copies each
  subtask's state files into the savepoint directory (on the executors), then
  `_metadata` there (storage/savepoints.py). The job keeps running.
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

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.runtime.failures import summarize as _summary

log = logging.getLogger("sparkpoint.runtime.jobmaster")


@dataclass
class StopRequest:
    savepoint: bool
    target: str | None
    future: Future


def savepoint_identity(data: CompletedCheckpointData) -> str:
    """What a checkpoint taken after starting from a savepoint records about it, so a
    rerun with the same `--from-savepoint` resumes from the job's own checkpoints."""
    return f"{data.job_name}/{data.checkpoint_id}@{data.completion_timestamp_ms}"


class SavepointSteps:
    """JobMaster's savepoint and stop steps; they use the job's attributes (coordinator,
    gateway, settings, progress, _stop_requests)."""

    # ------------------------------------------------------------------ public
    def trigger_savepoint(self, target: str | None = None) -> Future:
        """Take a savepoint now; the future completes with its path (or URL)."""
        log.info("savepoint requested%s", f" to {target}" if target else "")
        return self._savepoint_path(self.coordinator.trigger_savepoint(target))

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
        fut = (self.trigger_savepoint(request.target) if request.savepoint
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
