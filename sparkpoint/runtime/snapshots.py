"""A checkpoint at its barrier epoch (`Snapshotter`) and once it is complete (`Committer`).

At the barrier epoch every participant's part is small: the job's position
(runtime/position.py), the sources' positions, each sink's pre-commit handle, and each
subtask's lineage (snapshot + change logs) that the executors already made durable
while the epoch ran. The state participants still ack through the gateway's
asynchronous lane, so an abort, a late ack or a rehearsed fault behaves as for any
asynchronous snapshot part.

Once the coordinator has written `_metadata` (finalize), the gateway's committer thread
calls `Committer.on_complete`: sinks publish, state files no checkpoint needs any more
are deleted, sources commit their offsets. The final checkpoint's commit (end of input,
a stop) is `Committer.commit_final`, retried before the job may say FINISHED."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from sparkpoint.checkpoint import CheckpointFailureReason
from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.errors import SnapshotCancelled, StorageError
from sparkpoint.runtime.epoch_replay import EpochReplay
from sparkpoint.runtime.failures import JOB, FailoverRequired
from sparkpoint.runtime.failures import summarize as _summary
from sparkpoint.runtime.gateway import Barrier, RuntimeGateway
from sparkpoint.runtime.lineages import Lineages
from sparkpoint.runtime.participants import sink_participant, source_participant, state_participant, \
    step_participants
from sparkpoint.runtime.position import JobPosition
from sparkpoint.runtime.savepoints import one_savepoint_at_a_time
from sparkpoint.storage.handles import referenced_paths

log = logging.getLogger("sparkpoint.runtime.jobmaster")


@dataclass(frozen=True)
class Barriers:
    """The barriers one epoch carries: the newest checkpoint's, and a savepoint's."""
    carried: tuple[Barrier, ...] = ()
    savepoint: Barrier | None = None

    @property
    def checkpoint_id(self) -> int | None:
        """The newest: the executors' synchronous part (and its rehearsed faults) is for it."""
        return self.carried[-1].checkpoint_id if self.carried else None


class Snapshotter:
    """Every participant of a checkpoint acks (or declines) at its barrier epoch."""

    def __init__(self, coordinator: Any, gateway: RuntimeGateway, faults: Any, position: JobPosition,
                 epoch_plans: EpochReplay, sinks: Mapping[str, Any], lineages_of: Mapping[str, Lineages],
                 storage_options: Mapping[str, Any], *, ack_at_epoch_end: bool = True,
                 state_schemas: Any = None):
        self.coordinator = coordinator
        self.gateway = gateway
        self.faults = faults
        self.position = position
        self.epoch_plans = epoch_plans
        self.sinks = sinks
        self.lineages_of = lineages_of
        self.storage_options = dict(storage_options)
        # Rehearsals that fail the executors' storage writes of a given checkpoint need its
        # barrier inside an epoch; otherwise checkpoints complete at the end of the epoch
        # they were triggered in (`at_epoch_end`).
        self.ack_at_epoch_end = ack_at_epoch_end
        self.previous_barrier_epoch = -1  # for the bytes a checkpoint added to storage
        self.state_schemas = state_schemas  # each step's declared schema, recorded in its handles

    # -- before the epoch ----------------------------------------------------------------
    def take_barriers(self) -> Barriers:
        """The barriers triggered since the last boundary; this epoch carries them.
        Several between two boundaries share one snapshot: the older checkpoints are
        subsumed by the newest (declined as not counted). A savepoint is never subsumed:
        the oldest one is carried too, later ones by later epochs."""
        barriers = self.gateway.take_barriers(one_savepoint_at_a_time())
        if not barriers:
            return Barriers()
        savepoint = next((b for b in reversed(barriers) if b.properties.savepoint), None)
        carried = tuple(b for b in barriers if b is savepoint or b is barriers[-1])
        for older in barriers:
            if not any(older is b for b in carried):
                self.coordinator.decline(older.checkpoint_id, JOB, CheckpointFailureReason.SUBSUMED, None)
        return Barriers(carried, savepoint)

    # -- after the epoch -----------------------------------------------------------------
    def ack_barriers(self, barriers: Barriers, result: Any) -> None:
        """The epoch that carried `barriers` is done: ack them, then the checkpoints
        triggered while it ran (`at_epoch_end`)."""
        for barrier in barriers.carried:
            self.ack(barrier.checkpoint_id, result,
                     savepoint_url=barrier.location.url if barrier is barriers.savepoint else None)
        if self.ack_at_epoch_end:
            self.at_epoch_end(result)

    def at_epoch_end(self, result: Any) -> None:
        """Checkpoints triggered while this epoch ran complete now, at its end, not one
        epoch later: the state after it is already durable (its change logs were written
        before it committed), so nothing is left to do on the executors. Savepoints wait
        for the next epoch, which copies their files."""
        late = self.gateway.take_barriers(lambda b: not b.properties.savepoint)
        for older in late[:-1]:
            self.coordinator.decline(older.checkpoint_id, JOB, CheckpointFailureReason.SUBSUMED, None)
        if not late:
            return
        checkpoint_id = late[-1].checkpoint_id
        errors = {step: {i: "OSError: injected fault: synchronous snapshot part"
                         for i in self.faults.sync_failures(checkpoint_id,
                                                            step_participants(step, lineages.parallelism))}
                  for step, lineages in self.lineages_of.items()}
        self.ack(checkpoint_id, result.with_sync_errors(errors))

    def ack(self, checkpoint_id: int, result: Any, savepoint_url: str | None = None) -> None:
        """Every participant's part of `checkpoint_id`, as of the epoch that just ended."""
        c = self.coordinator
        job = self.position.to_checkpoint(int(time.time() * 1000), self.epoch_plans.history)
        if savepoint_url is not None:
            job["savepoint"] = savepoint_url  # where it is: the copies' directory
        c.acknowledge(checkpoint_id, JOB, job)
        for name, handle in self.position.source_handles().items():
            c.acknowledge(checkpoint_id, source_participant(name), handle)
        for name, sink in self.sinks.items():
            participant = sink_participant(name)
            try:
                self.faults.check_sync(participant, checkpoint_id)
                unlogged = self.epoch_plans.flush()
                if unlogged is not None:  # never publish an epoch a fall-back could not replay
                    raise StorageError(unlogged)
                sink_handle = dict(sink.pre_commit(checkpoint_id))
                if savepoint_url is not None:  # a savepoint is self-contained: the sink copies what it staged
                    sink_handle = dict(sink.savepoint_handle(sink_handle, savepoint_url, self.storage_options))
            except Exception as e:
                log.warning("checkpoint %d: pre-commit of sink %s failed: %s", checkpoint_id, name, _summary(e))
                c.decline(checkpoint_id, participant, CheckpointFailureReason.TASK_SYNC_FAILURE, e)
            else:
                c.acknowledge(checkpoint_id, participant, sink_handle)
        if not self.lineages_of:
            return
        try:
            for step in self.lineages_of:
                self._ack_states(checkpoint_id, step, result.steps[step], savepoint_url is not None)
        finally:
            self.previous_barrier_epoch = self.position.epoch

    def _ack_states(self, checkpoint_id: int, step: str, result: Any, savepoint: bool = False) -> None:
        c = self.coordinator
        lineages = self.lineages_of[step]
        for subtask in range(lineages.parallelism):
            participant = state_participant(step, subtask)
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
            if self.state_schemas is not None and subtask == 0:  # once per step keeps _metadata small
                handle = self.state_schemas.with_schema(step, handle)
            self._ack_state(checkpoint_id, participant, handle)

    def _ack_state(self, checkpoint_id: int, participant: str, handle: dict) -> None:
        started = time.monotonic()
        since_epoch = self.previous_barrier_epoch
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


def live_state_handles(lineages_of: Mapping[str, Lineages]) -> list[dict]:
    """State files the running job still needs but no checkpoint references yet."""
    return [h for lineages in lineages_of.values() for h in lineages.live_handles()]


class Committer:
    """What a completed checkpoint commits: the sinks' output, the sources' offsets, and
    the deletion of state files and epoch plans no retained checkpoint needs."""

    def __init__(self, job_name: str, storage: Any, coordinator: Any, gateway: RuntimeGateway,
                 sources: Mapping[str, Any], sinks: Mapping[str, Any], lineages_of: Mapping[str, Lineages],
                 epoch_plans: EpochReplay):
        self.job_name = job_name
        self.storage = storage
        self.coordinator = coordinator
        self.gateway = gateway
        self.sources = sources
        self.sinks = sinks
        self.lineages_of = lineages_of
        self.epoch_plans = epoch_plans

    def on_complete(self, checkpoint_id: int, data: CompletedCheckpointData) -> None:
        """Runs on the committer thread, after `_metadata` is durable: publish output,
        commit source offsets."""
        for name, sink in self.sinks.items():
            sink_handle = data.handles.get(sink_participant(name))
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
            src = data.handles.get(source_participant(name))
            if src is not None:
                try:
                    source.notify_checkpoint_complete(checkpoint_id, src["positions"])
                except Exception:
                    log.exception("source %s: post-checkpoint hook failed (ignored)", name)

    def commit_final(self, stopped: threading.Event, backoff_s: Sequence[float]) -> bool:
        """The final checkpoint (end of a bounded input, a stop) is committed before the job
        may say FINISHED: no later checkpoint would publish its output. A failed commit is
        retried after each pause of `backoff_s`; if it keeps failing the job fails over
        (recovery re-runs the commit of the restored checkpoint) and the restart strategy
        decides from there. The source's completion hook (offsets to the broker, dead
        letters published) runs again here, where a failure is not ignored. False if the
        job was stopped (`stopped`) first."""
        self.gateway.drain_commits()
        latest = self.coordinator.completed_store.latest()
        checkpoint_id = latest.checkpoint_id if latest is not None else None
        error: BaseException | None = None
        for attempt, pause in enumerate((0.0, *backoff_s)):
            if attempt:
                log.warning("job %s: the commit of the final checkpoint %s failed (%s); retry %d of %d in %.1f s",
                            self.job_name, checkpoint_id, _summary(error), attempt, len(backoff_s), pause)
                if stopped.wait(pause):
                    return False
            try:
                failed = self.gateway.failed_commit()
                if failed is not None:
                    checkpoint_id = failed[0]
                    if attempt == 0:
                        raise failed[2]  # the committer's own attempt
                    self.gateway.commit_again(failed[0], failed[1])
                for name, src in self.sources.items():
                    handle = latest.handles.get(source_participant(name)) if latest is not None else None
                    if handle is not None:
                        src.notify_checkpoint_complete(latest.checkpoint_id, handle["positions"])
                return True
            except Exception as e:  # noqa: BLE001 - retried, then a failover
                error = e
        raise FailoverRequired(f"the commit of the final checkpoint {checkpoint_id} failed "
                               f"{len(backoff_s) + 1} times ({_summary(error)}); its output is still staged")

    def _delete_unneeded_state(self, checkpoint_epoch: int) -> None:
        """Change logs and snapshot files that a newer snapshot replaced before any
        checkpoint took them would otherwise wait for the start-up garbage collector:
        delete those no retained checkpoint references (this checkpoint and every later
        one do not, nor does the running job)."""
        candidates = [p for lineages in self.lineages_of.values() for p in lineages.take_unneeded(checkpoint_epoch)]
        if not candidates:
            return
        keep = referenced_paths([h for c in self.coordinator.completed_store.all() for h in c.handles.values()])
        keep |= referenced_paths(live_state_handles(self.lineages_of))
        doomed = [p for p in candidates if p not in keep]
        try:
            self.storage.lease.check()
            for rel in doomed:
                self.storage.fs.rm(self.storage.layout.resolve(rel))
        except Exception as e:  # only garbage: the start-up collector removes what is left
            log.warning("could not delete %d state files no checkpoint needs (%s); the next start-up "
                        "garbage collection removes them", len(doomed), _summary(e))
