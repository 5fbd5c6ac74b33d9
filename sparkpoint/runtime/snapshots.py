"""A checkpoint's parts at the barrier (synchronous) and in the background
(asynchronous uploads), and what happens once it completes (part of JobMaster)."""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future

from sparkpoint.checkpoint import CheckpointFailureReason
from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.errors import SnapshotCancelled
from sparkpoint.runtime.failures import JOB
from sparkpoint.runtime.failures import summarize as _summary
from sparkpoint.runtime.gateway import remove_local_checkpoints
from sparkpoint.runtime.subtask import local_checkpoint_dir, store_dir

log = logging.getLogger("sparkpoint.runtime.jobmaster")


class SnapshotSteps:
    """JobMaster's snapshot steps; they use the job's attributes (coordinator, gateway,
    storage, faults, operator, sink, source)."""

    def _snapshot(self, checkpoint_id: int, result) -> None:
        """The synchronous parts at the barrier, then the asynchronous ones."""
        c = self.coordinator
        c.acknowledge(checkpoint_id, JOB, {"epoch": self.epoch, "max_event_time": self.max_event_time,
                                           "watermark": self._watermark(), "records": self.records})
        c.acknowledge(checkpoint_id, self.source_participant, {"positions": dict(self.positions)})
        try:
            self.faults.check_sync(self.sink_participant, checkpoint_id)
            sink_handle = dict(self.sink.pre_commit(checkpoint_id))
        except Exception as e:
            log.warning("checkpoint %d: sink pre-commit failed: %s", checkpoint_id, _summary(e))
            c.decline(checkpoint_id, self.sink_participant, CheckpointFailureReason.TASK_SYNC_FAILURE, e)
        else:
            c.acknowledge(checkpoint_id, self.sink_participant, sink_handle)
        if self.operator is None:
            return
        for subtask in range(self.P):
            participant = self.state_participant(subtask)
            error = result.sync_errors.get(subtask)
            if error:
                log.warning("checkpoint %d: synchronous snapshot of %s failed: %s", checkpoint_id, participant, error)
                c.decline(checkpoint_id, participant, CheckpointFailureReason.TASK_SYNC_FAILURE, error)
                continue
            self._start_upload(checkpoint_id, subtask)

    def _start_upload(self, checkpoint_id: int, subtask: int) -> None:
        from sparkpoint.state.upload import upload_snapshot

        participant = self.state_participant(subtask)
        local = local_checkpoint_dir(self.local_root, self.operator.name, subtask, checkpoint_id)
        started = time.monotonic()
        cancelled = self.gateway.cancel_event(checkpoint_id)

        def upload(cancel: threading.Event):
            log.info("checkpoint %d: asynchronous part of %s started", checkpoint_id, participant)
            self.faults.before_async(participant, checkpoint_id, cancel)
            return upload_snapshot(local, self.storage.fs, self.storage.layout, checkpoint_id,
                                   f"state/{self.operator.name}/{subtask}", previous=self._previous_index(),
                                   cancel=cancel, hash_cache=self.hash_cache)

        def done(fut: Future) -> None:
            # A future cancelled before it ran (pool shut down) raises from exception().
            if fut.cancelled() or isinstance(fut.exception(), SnapshotCancelled) or \
                    (cancelled is not None and cancelled.is_set()):
                # The checkpoint was aborted (its local copy may be gone too, so any error
                # here is a consequence of the abort): the abort path owns it.
                return
            error = fut.exception()
            if error is not None:
                log.warning("checkpoint %d: asynchronous snapshot of %s failed: %s", checkpoint_id, participant,
                            _summary(error))
                self.coordinator.decline(checkpoint_id, participant, CheckpointFailureReason.TASK_ASYNC_FAILURE,
                                         error)
                return
            uploaded = fut.result()
            if self.faults.lose_ack(participant, checkpoint_id):
                log.warning("checkpoint %d: ack of %s dropped by fault injection", checkpoint_id, participant)
                return
            metrics = dict(uploaded.metrics.to_json())
            metrics["bytes"] = int(metrics.get("bytes_uploaded", 0))
            metrics["async_ms"] = int((time.monotonic() - started) * 1000)
            self.coordinator.acknowledge(checkpoint_id, participant, uploaded.handle, metrics)

        if not self.gateway.start_async_part(checkpoint_id, upload, done):
            log.debug("checkpoint %d already aborted; no upload for %s", checkpoint_id, participant)

    def _previous_index(self):
        from sparkpoint.state.snapshot import SnapshotHandleIndex

        handles = [h for c in self.coordinator.completed_store.all() for p, h in c.handles.items()
                   if p.startswith("state:")]
        return SnapshotHandleIndex.from_handles(handles)

    def _on_checkpoint_complete(self, checkpoint_id: int, data: CompletedCheckpointData) -> None:
        """Runs on the committer thread, after `_metadata` is durable: publish output,
        commit source offsets, drop local recovery copies nobody needs."""
        sink_handle = data.handles.get(self.sink_participant)
        if sink_handle is not None:
            self.sink.commit(sink_handle)
        src = data.handles.get(self.source_participant)
        if src is not None:
            try:
                self.source.notify_checkpoint_complete(checkpoint_id, src["positions"])
            except Exception:
                log.exception("source %s: post-checkpoint hook failed (ignored)", self.source.name)
        if self.operator is not None:
            keep = {c.checkpoint_id for c in self.coordinator.completed_store.all()}
            keep |= set(self.coordinator.pending_checkpoint_ids())
            for i in range(self.P):
                remove_local_checkpoints(os.path.dirname(store_dir(self.local_root, self.operator.name, i)), keep)
