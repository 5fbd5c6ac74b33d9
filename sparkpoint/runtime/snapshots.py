"""A checkpoint's parts at the barrier and what happens once it completes (part of
JobMaster).

At the barrier epoch every participant's part is small: the job's epoch and
watermark, the sources' positions, the sink's pre-commit handle, and each
subtask's lineage (snapshot + change logs) that the executors already made
durable while the epoch ran. The state participants still ack through the
gateway's asynchronous lane, so an abort, a late ack or a rehearsed fault behaves
as for any asynchronous snapshot part."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

from sparkpoint.checkpoint import CheckpointFailureReason
from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.errors import SnapshotCancelled, StorageError
from sparkpoint.runtime.failures import JOB
from sparkpoint.runtime.failures import summarize as _summary
from sparkpoint.storage.handles import referenced_paths

log = logging.getLogger("sparkpoint.runtime.jobmaster")


class SnapshotSteps:
    """JobMaster's snapshot steps; they use the job's attributes (coordinator, gateway,
    lineages, faults, operator, sink, source)."""

    def _snapshot(self, checkpoint_id: int, result, savepoint_url: str | None = None) -> None:
        c = self.coordinator
        job = self.position.to_checkpoint(int(time.time() * 1000), self.epoch_plans.history)
        if savepoint_url is not None:
            job["savepoint"] = savepoint_url  # where it is: the copies' directory
        c.acknowledge(checkpoint_id, JOB, job)
        for name, handle in self.position.source_handles().items():
            c.acknowledge(checkpoint_id, f"source:{name}", handle)
        for name, sink in self.sinks.items():
            participant = f"sink:{name}"
            try:
                self.faults.check_sync(participant, checkpoint_id)
                unlogged = self.epoch_plans.flush()
                if unlogged is not None:  # never publish an epoch a fall-back could not replay
                    raise StorageError(unlogged)
                sink_handle = dict(sink.pre_commit(checkpoint_id))
                if savepoint_url is not None:  # a savepoint is self-contained: the sink copies what it staged
                    sink_handle = dict(sink.savepoint_handle(sink_handle, savepoint_url,
                                                             dict(self.settings.storage_options)))
            except Exception as e:
                log.warning("checkpoint %d: pre-commit of sink %s failed: %s", checkpoint_id, name, _summary(e))
                c.decline(checkpoint_id, participant, CheckpointFailureReason.TASK_SYNC_FAILURE, e)
            else:
                c.acknowledge(checkpoint_id, participant, sink_handle)
        if not self.operators:
            return
        try:
            for step in self.operators:
                self._ack_states(checkpoint_id, step, result.steps[step], savepoint_url is not None)
        finally:
            self._previous_barrier_epoch = self.epoch

    def _ack_states(self, checkpoint_id: int, step: str, result, savepoint: bool = False) -> None:
        c = self.coordinator
        lineages = self.lineages_of[step]
        for subtask in range(self.P):
            participant = self.state_participant(subtask, step)
            error = result.sync_errors.get(subtask)
            if savepoint and not error:
                info = result.infos.get(subtask) or {}
                error = info.get("savepoint_error") or (None if "savepoint" in info else
                                                        "the subtask did not copy its state files")
                if error:
                    error = f"copying the state files into the savepoint failed: {error}"
            if error:
                log.warning("checkpoint %d: synchronous snapshot of %s failed: %s", checkpoint_id, participant, error)
                c.decline(checkpoint_id, participant, CheckpointFailureReason.TASK_SYNC_FAILURE, error)
                continue
            handle, why_not = lineages.handle(subtask)
            if handle is None:
                log.warning("checkpoint %d: state of %s is not durable: %s. The job keeps running; a later "
                            "checkpoint completes once checkpoint storage takes the change logs",
                            checkpoint_id, participant, why_not)
                c.decline(checkpoint_id, participant, CheckpointFailureReason.TASK_ASYNC_FAILURE,
                          StorageError(why_not))
                continue
            self._ack_state(checkpoint_id, participant, handle)

    def _ack_state(self, checkpoint_id: int, participant: str, handle: dict) -> None:
        started = time.monotonic()
        since_epoch = self._previous_barrier_epoch
        cancelled = self.gateway.cancel_event(checkpoint_id)

        def confirm(cancel: threading.Event) -> dict:
            log.info("checkpoint %d: asynchronous part of %s started", checkpoint_id, participant)
            self.faults.before_async(participant, checkpoint_id, cancel)
            if cancel.is_set():
                raise SnapshotCancelled(f"checkpoint {checkpoint_id} was aborted")
            return handle

        def done(fut: Future) -> None:
            if fut.cancelled() or isinstance(fut.exception(), SnapshotCancelled) or \
                    (cancelled is not None and cancelled.is_set()):
                return  # the checkpoint was aborted: the abort path owns it
            error = fut.exception()
            if error is not None:
                log.warning("checkpoint %d: asynchronous snapshot of %s failed: %s", checkpoint_id, participant,
                            _summary(error))
                self.coordinator.decline(checkpoint_id, participant, CheckpointFailureReason.TASK_ASYNC_FAILURE,
                                         error)
                return
            if self.faults.lose_ack(participant, checkpoint_id):
                log.warning("checkpoint %d: ack of %s dropped by fault injection", checkpoint_id, participant)
                return
            files = handle["changelog"]["files"] + ((handle.get("base") or {}).get("files") or [])
            base = handle.get("base") or {}
            # What this checkpoint added to storage: change logs and snapshot uploads since
            # the previous barrier (the checkpoint itself uploads nothing).
            written = sum(int(f["size"]) for f in handle["changelog"]["files"] if int(f["epoch"]) > since_epoch)
            if int(handle.get("base_epoch", -1)) > since_epoch:
                written += int(base.get("bytes_uploaded", 0))
            metrics = {"bytes": written,
                       "state_bytes": sum(int(f["size"]) for f in files),
                       "changelogs": len(handle["changelog"]["files"]),
                       "async_ms": int((time.monotonic() - started) * 1000)}
            self.coordinator.acknowledge(checkpoint_id, participant, fut.result(), metrics)

        if not self.gateway.start_async_part(checkpoint_id, confirm, done):
            log.debug("checkpoint %d already aborted; no ack for %s", checkpoint_id, participant)

    def _on_checkpoint_complete(self, checkpoint_id: int, data: CompletedCheckpointData) -> None:
        """Runs on the committer thread, after `_metadata` is durable: publish output,
        commit source offsets."""
        for name, sink in self.sinks.items():
            sink_handle = data.handles.get(f"sink:{name}")
            if sink_handle is not None:
                self.storage.lease.check()  # publish only while this run may act for the job
                sink.commit(sink_handle)
        if self.lineages_of:
            self._delete_unneeded_state(int(data.handles[JOB]["epoch"]))
        if self.epoch_plans.enabled:  # a restore never goes below the oldest retained checkpoint
            retained = [int(c.handles[JOB]["epoch"]) for c in self.coordinator.completed_store.all()
                        if JOB in c.handles]
            if retained:
                self.epoch_plans.forget_through(min(retained))
        for name, source in self.sources.items():
            src = data.handles.get(f"source:{name}")
            if src is not None:
                try:
                    source.notify_checkpoint_complete(checkpoint_id, src["positions"])
                except Exception:
                    log.exception("source %s: post-checkpoint hook failed (ignored)", name)

    def _delete_unneeded_state(self, checkpoint_epoch: int) -> None:
        """Change logs and snapshot files that a newer snapshot replaced before any
        checkpoint took them would otherwise wait for the start-up garbage collector:
        delete those no retained checkpoint references (this checkpoint and every later
        one do not, nor does the running job)."""
        candidates = [p for lineages in self.lineages_of.values() for p in lineages.take_unneeded(checkpoint_epoch)]
        if not candidates:
            return
        keep = referenced_paths([h for c in self.coordinator.completed_store.all() for h in c.handles.values()])
        keep |= referenced_paths(self._live_state_handles())
        doomed = [p for p in candidates if p not in keep]
        try:
            self.storage.lease.check()
            for rel in doomed:
                self.storage.fs.rm(self.storage.layout.resolve(rel))
        except Exception as e:  # only garbage: the start-up collector removes what is left
            log.warning("could not delete %d state files no checkpoint needs (%s); the next start-up "
                        "garbage collection removes them", len(doomed), _summary(e))
