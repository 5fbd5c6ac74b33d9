"""The checkpoint coordinator: triggers checkpoints on a clock, collects acks and
declines, finalizes, and decides what a failure means. Knows nothing of Spark.

Lifecycle of one checkpoint
---------------------------
1. Trigger (periodic timer, or `trigger_checkpoint`): pre-checks in Flink's order
   (`trigger_decider.decide_trigger`) - shut down; periodic scheduling off (periodic
   triggers only); a request already queued; too many concurrent (a periodic request
   is queued); min pause not over (the periodic trigger is moved to when the pause
   ends); then participants not running (`gateway.not_ready()`).
   Forced checkpoints skip the queued / concurrent / min-pause checks.
2. Start: an id from the durable counter, then `storage.initialize_location(id)`.
   An id collision (a `chk-<id>/` left by a crashed run, seed 002) skips to a fresh id.
   The pre-checks run again (the lock was released), then the attempt is registered,
   its expiry timer set, and `gateway.trigger` asks for the barrier.
3. Acks and declines arrive from any thread. Messages for attempts that are over, or
   for unknown ids, change nothing and fail nothing (seed 000).
4. Finalize, once every participant acked, in this order:
   a. write `_metadata` (exclusive create) - from here the checkpoint is durable;
   b. add it to the completed store (which pushes out the oldest beyond retention);
   c. abort older pending attempts (SUBSUMED), reset the failure count, record stats;
   d. `gateway.notify_complete` (sources commit offsets, sinks commit);
   e. only now delete the checkpoints pushed out in (b).
   A crash before (a) loses the attempt only; after (a) the checkpoint is restorable
   and the restore re-runs the sinks' commit (DESIGN.md §2).
5. Abort (decline, expiry, trigger error, finalize error, stop, shutdown): the attempt
   is removed, `failure_reporting` has the failure manager decide whether it counts,
   logs it and raises the alarm; `gateway.abort` stops its writers, and only when
   that future completes are its files deleted (seed 000).

Threads and locks
-----------------
`_lock` guards the coordinator's state and is held only for in-memory work: the
gateway, storage, id counter, failure manager, alarm listeners and futures are never
called while holding it (scheduler calls are: schedulers never run a timer inline).
`_trigger_lock` serializes steps 2 (id counter and storage I/O) so ids reach the
participants in order; `_finalize_lock` serializes step 4 so completions are recorded
in id order. Order: `_trigger_lock`, then `_finalize_lock` (only when a gateway acks
synchronously inside `trigger`), then `_lock`. Callbacks the coordinator calls
(`fail_job`, alarm listeners, gateway methods) may call back into it - stop, shut
down, ack, decline - but must not trigger a checkpoint synchronously.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Mapping

from sparkpoint.checkpoint.alarms import AlarmBus, summarize_error
from sparkpoint.checkpoint.completed_store import CompletedCheckpointStore
from sparkpoint.checkpoint.config import CheckpointCoordinatorConfig
from sparkpoint.checkpoint.exceptions import CheckpointFailedError, CoordinatorShutDownError
from sparkpoint.checkpoint.failure_manager import CheckpointFailureManager, FailJob
from sparkpoint.checkpoint.failure_reporting import FailureReporter
from sparkpoint.checkpoint.interfaces import (
    Cancellable,
    CheckpointIDCounter,
    CheckpointLocation,
    CheckpointProperties,
    CheckpointStorage,
    CompletedCheckpointData,
    ParticipantGateway,
    ParticipantId,
    Scheduler,
    StateHandle,
    SupportsHighestCheckpointId,
)
from sparkpoint.checkpoint.pending import AckResult, PendingCheckpoint
from sparkpoint.checkpoint.reasons import CheckpointFailureReason as R
from sparkpoint.checkpoint.stats import CheckpointStatsTracker
from sparkpoint.checkpoint.trigger_decider import TriggerState, decide_trigger
from sparkpoint.errors import CheckpointIdCollision, LeaseLostError, MetadataExistsError, StorageError

log = logging.getLogger(__name__)

# Fresh ids tried per trigger when `chk-<id>/` already exists. Each collision moves
# the durable counter past it, so the next trigger starts beyond these anyway.
MAX_ID_ATTEMPTS = 16
# How many finished attempts are remembered to explain late messages in the log.
_RECENT_OUTCOMES = 128


class _StartFailed(Exception):
    def __init__(self, checkpoint_id: int | None, reason: R, error: BaseException | None):
        self.checkpoint_id, self.reason, self.error = checkpoint_id, reason, error


def _fail_job_not_configured(reason: R, error: BaseException) -> None:
    log.error("checkpoint failures call for failing the job, but the coordinator was built "
              "without fail_job: %s", error)


class CheckpointCoordinator:
    def __init__(self, job_name: str, config: CheckpointCoordinatorConfig, scheduler: Scheduler,
                 id_counter: CheckpointIDCounter, storage: CheckpointStorage,
                 gateway: ParticipantGateway, *,
                 failure_manager: CheckpointFailureManager | None = None,
                 stats: CheckpointStatsTracker | None = None,
                 alarms: AlarmBus | None = None,
                 completed_store: CompletedCheckpointStore | None = None,
                 rng: random.Random | None = None,
                 fail_job: FailJob | None = None) -> None:
        """`fail_job(reason, error)` is called (never under a coordinator lock) when
        counted failures exceed the tolerance, or at once for a fatal reason
        (`reason.fatal`, LEASE_LOST: do not restart). Ignored if `failure_manager` is given.
        The id counter is started here and shut down by `shutdown()`."""
        self.job_name = job_name
        self.config = config
        self._scheduler = scheduler
        self._ids = id_counter
        self._storage = storage
        self._gateway = gateway
        self.failure_manager = failure_manager or CheckpointFailureManager(
            config.tolerable_failed, fail_job or _fail_job_not_configured)
        self.stats = stats or CheckpointStatsTracker(job_name)
        self.alarms = alarms or AlarmBus()
        self.completed_store = completed_store or CompletedCheckpointStore(config.num_retained)
        self._rng = rng or random.Random()
        self._failures = FailureReporter(job_name, self.failure_manager, self.stats, self.alarms,
                                         scheduler.now_ms)

        self._lock = threading.Lock()
        # Re-entrant: a gateway may answer synchronously from inside a call we make
        # while holding one (e.g. ack inside `trigger`, which may finalize).
        self._trigger_lock = threading.RLock()
        self._finalize_lock = threading.RLock()
        self._pending: dict[int, PendingCheckpoint] = {}
        self._recent: OrderedDict[int, str] = OrderedDict()
        self._periodic_trigger: Cancellable | None = None
        self._periodic_scheduling = False
        self._trigger_request_queued = False
        self._last_completion_ms: int | None = None
        self._latest_completed_id = -1
        self._shutdown = False
        self._closed = False
        self._fenced = False  # lost the lease: never touch storage again

        self._ids.start()

    # ------------------------------------------------------------------ inspection
    def pending_checkpoint_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._pending)

    @property
    def is_shutdown(self) -> bool:
        return self._shutdown

    @property
    def periodic_scheduling(self) -> bool:
        return self._periodic_scheduling

    @property
    def trigger_request_queued(self) -> bool:
        return self._trigger_request_queued

    # ------------------------------------------------------------------ scheduling
    def job_status_changed(self, status: str) -> None:
        """RUNNING starts periodic checkpoints; any other status stops them."""
        if status == "RUNNING":
            if self._shutdown:
                log.debug("job %s is RUNNING but the coordinator is shut down; not scheduling",
                          self.job_name)
                return
            self.start_scheduler()
        else:
            self.stop_scheduler()

    def start_scheduler(self) -> None:
        """First trigger after a random delay in [min pause, interval], so that many
        jobs started together do not checkpoint in lockstep; then every interval."""
        if self._shutdown:
            raise CoordinatorShutDownError(
                f"the checkpoint coordinator of job {self.job_name} is shut down; "
                "build a new one to checkpoint again")
        self.stop_scheduler()
        lo = self.config.min_pause_ms
        hi = max(self.config.interval_ms, lo)
        with self._lock:
            if self._shutdown:
                return
            self._periodic_scheduling = True
            delay = self._rng.randint(lo, hi)
            self._periodic_trigger = self._scheduler.schedule_at_fixed_rate(
                delay, self.config.interval_ms, self._on_periodic_timer)
        log.info("periodic checkpoints of job %s start in %d ms, every %d ms",
                 self.job_name, delay, self.config.interval_ms)

    def stop_scheduler(self) -> None:
        """Stop periodic triggers and abort every pending checkpoint (not counted)."""
        with self._lock:
            self._trigger_request_queued = False
            self._periodic_scheduling = False
            self._cancel_periodic_trigger()
            aborted = self._take_all_pending(R.COORDINATOR_SUSPENDING)
        for pending in aborted:
            self._after_abort(pending, R.COORDINATOR_SUSPENDING)

    def shutdown(self) -> None:
        """Stop scheduling, abort pending checkpoints, shut down the id counter. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._shutdown = True
            self._periodic_scheduling = False
            self._trigger_request_queued = False
            self._cancel_periodic_trigger()
            aborted = self._take_all_pending(R.COORDINATOR_SHUTDOWN)
        for pending in aborted:
            self._after_abort(pending, R.COORDINATOR_SHUTDOWN)
        try:
            self._ids.shutdown()
        except Exception as e:
            log.warning("could not shut down the checkpoint id counter of job %s: %s", self.job_name, e)
        log.info("checkpoint coordinator of job %s shut down", self.job_name)

    def _on_periodic_timer(self) -> None:
        try:
            self._trigger(CheckpointProperties(forced=False, periodic=True))
        except Exception:
            log.exception("periodic checkpoint trigger of job %s failed unexpectedly; "
                          "the next trigger runs as scheduled", self.job_name)

    # ------------------------------------------------------------------ triggering
    def trigger_checkpoint(self, forced: bool = False, *,
                           periodic: bool = False) -> Future[CompletedCheckpointData]:
        """Ask for a checkpoint now. The future completes with the checkpoint's data once
        it is durable and participants were notified, or fails with
        `CheckpointFailedError` (its `.reason` says why, e.g. TOO_MANY_CONCURRENT).
        `periodic=True` is what the timer uses; it is refused while scheduling is off."""
        return self._trigger(CheckpointProperties(forced=forced, periodic=periodic))

    def _trigger(self, props: CheckpointProperties) -> Future[CompletedCheckpointData]:
        with self._lock:
            refusal = self._precheck(props)
        if refusal is not None:
            return self._refuse(refusal)
        not_ready = list(self._gateway.not_ready())
        if not_ready:
            shown = ", ".join(sorted(not_ready)[:5]) + (" ..." if len(not_ready) > 5 else "")
            return self._refuse(R.NOT_ALL_REQUIRED_TASKS_RUNNING, f"not running: {shown}")
        participants = list(self._gateway.participants())

        with self._trigger_lock:
            try:
                checkpoint_id, location = self._allocate_location()
            except _StartFailed as f:
                return self._fail_before_start(f.checkpoint_id, f.reason, f.error)
            pending = PendingCheckpoint(checkpoint_id, self._scheduler.now_ms(), location,
                                        participants, props)
            with self._lock:
                # Re-check: the lock was released while talking to storage.
                refusal = self._precheck(props)
                if refusal is None:
                    self._pending[checkpoint_id] = pending
            if refusal is not None:
                self._discard_unused_location(checkpoint_id)
                return self._refuse(refusal)

            expiry = self._scheduler.schedule(self.config.timeout_ms, lambda: self._expire(pending))
            with self._lock:
                pending.set_expiry(expiry)
            self.stats.report_triggered(checkpoint_id)
            log.info("triggering checkpoint %d @ %d for job %s (%d participants%s)", checkpoint_id,
                     pending.trigger_timestamp_ms, self.job_name, len(participants),
                     ", forced" if props.forced else "")
            try:
                self._gateway.trigger(checkpoint_id, pending.trigger_timestamp_ms, location, props)
            except Exception as e:
                self._abort_if_pending(pending, R.TRIGGER_FAILED, e)
                return pending.completion_future

        if not participants:
            self._finalize_if_complete(pending)
        return pending.completion_future

    def _precheck(self, props: CheckpointProperties) -> R | None:
        """Ask the trigger policy and apply its answer. Call with `_lock` held."""
        decision = decide_trigger(props, TriggerState(
            now_ms=self._scheduler.now_ms(), shutdown=self._shutdown,
            periodic_scheduling=self._periodic_scheduling,
            request_queued=self._trigger_request_queued, pending_count=len(self._pending),
            max_concurrent=self.config.max_concurrent, last_completion_ms=self._last_completion_ms,
            min_pause_ms=self.config.min_pause_ms))
        if decision.queue_request:
            # The timer stays off while a request waits; the request fires when an attempt ends.
            self._trigger_request_queued = True
            self._cancel_periodic_trigger()
        if decision.retry_in_ms is not None:
            self._cancel_periodic_trigger()
            self._periodic_trigger = self._scheduler.schedule_at_fixed_rate(
                decision.retry_in_ms, self.config.interval_ms, self._on_periodic_timer)
        return decision.refusal

    def _allocate_location(self) -> tuple[int, CheckpointLocation]:
        """A fresh id and its directory. Raises _StartFailed."""
        collided: tuple[int, BaseException] | None = None
        for _ in range(MAX_ID_ATTEMPTS):
            try:
                checkpoint_id = self._ids.get_and_increment()
            except LeaseLostError as e:
                raise _StartFailed(None, R.LEASE_LOST, e) from e
            except StorageError as e:
                raise _StartFailed(None, R.IO_EXCEPTION, e) from e
            try:
                return checkpoint_id, self._storage.initialize_location(checkpoint_id)
            except LeaseLostError as e:
                raise _StartFailed(checkpoint_id, R.LEASE_LOST, e) from e
            except CheckpointIdCollision as e:
                log.info("chk-%d of job %s already exists (left by an earlier run or another "
                         "writer); skipping to a fresh checkpoint id", checkpoint_id, self.job_name)
                collided = (checkpoint_id, e)
                self._skip_ids_past(checkpoint_id)
            except StorageError as e:
                # Not deleted: we cannot tell whether the directory is ours. Garbage
                # collection removes directories without _metadata.
                raise _StartFailed(checkpoint_id, R.IO_EXCEPTION, e) from e
        assert collided is not None
        raise _StartFailed(collided[0], R.ID_COLLISION, collided[1])

    def _skip_ids_past(self, checkpoint_id: int) -> None:
        next_id = checkpoint_id + 1
        if isinstance(self._storage, SupportsHighestCheckpointId):
            try:
                highest = self._storage.highest_checkpoint_id()
            except StorageError as e:
                log.info("could not list checkpoint ids of job %s (%s); probing the next id", self.job_name, e)
                highest = None
            if highest is not None:
                next_id = max(next_id, highest + 1)
        try:
            self._ids.set_count(next_id)
        except LeaseLostError as e:
            raise _StartFailed(checkpoint_id, R.LEASE_LOST, e) from e
        except StorageError as e:
            raise _StartFailed(checkpoint_id, R.IO_EXCEPTION, e) from e

    # ------------------------------------------------------------------ messages
    def acknowledge(self, checkpoint_id: int, participant: ParticipantId, handle: StateHandle,
                    metrics: Mapping[str, Any] | None = None) -> AckResult:
        """A participant's snapshot for `checkpoint_id` is durable. The last ack finalizes
        the checkpoint in the calling thread (writes `_metadata`, notifies)."""
        finalize = False
        why = ""
        with self._lock:
            pending = self._pending.get(checkpoint_id)
            if pending is None:
                result, why = self._explain_unknown(checkpoint_id)
            else:
                result = pending.acknowledge(participant, handle, metrics)
                if result is AckResult.SUCCESS and pending.is_fully_acknowledged:
                    finalize = self._take_for_finalize(pending)
        if result is AckResult.DUPLICATE:
            log.debug("duplicate ack for checkpoint %d from %s ignored", checkpoint_id, participant)
        elif result is AckResult.UNKNOWN and pending is not None:
            log.warning("ack for checkpoint %d from %s, which is not a participant of it; ignored",
                        checkpoint_id, participant)
        elif result is not AckResult.SUCCESS:
            # Its files are deleted with its checkpoint directory; shared files it uploaded
            # are left to garbage collection.
            log.debug("late ack for checkpoint %d from %s ignored: %s", checkpoint_id, participant, why)
        if finalize:
            assert pending is not None
            self._finalize(pending)
        return result

    def decline(self, checkpoint_id: int, participant: ParticipantId, reason: R,
                error: BaseException | None = None) -> bool:
        """A participant could not snapshot. Aborts the checkpoint and returns True, or
        returns False if the message is stale (the attempt is over or unknown): then
        nothing changes and nothing is counted (seed 000)."""
        with self._lock:
            pending = self._pending.get(checkpoint_id)
            if pending is None:
                _, why = self._explain_unknown(checkpoint_id)
            else:
                del self._pending[checkpoint_id]
                pending.abort(reason)
        if pending is None:
            log.debug("decline of checkpoint %d by %s (%s) ignored: %s", checkpoint_id, participant,
                      reason.name, why)
            return False
        self._after_abort(pending, reason, error, participant)
        return True

    def _expire(self, pending: PendingCheckpoint) -> None:
        with self._lock:
            if self._pending.get(pending.checkpoint_id) is not pending:
                return
            del self._pending[pending.checkpoint_id]
            pending.abort(R.EXPIRED)
            missing = sorted(pending.not_yet_acknowledged)
        shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
        self._after_abort(pending, R.EXPIRED, detail=f"no ack from: {shown}")

    def _explain_unknown(self, checkpoint_id: int) -> tuple[AckResult, str]:
        """Why a message names no pending checkpoint. Call with `_lock` held."""
        outcome = self._recent.get(checkpoint_id)
        if outcome is not None:
            return AckResult.DISCARDED, f"checkpoint {checkpoint_id} is already {outcome}"
        if checkpoint_id <= self._latest_completed_id:
            return AckResult.DISCARDED, (f"older than the latest completed checkpoint "
                                         f"{self._latest_completed_id}")
        return AckResult.UNKNOWN, ("unknown checkpoint id: not triggered by this coordinator "
                                   "(perhaps by a run before a restart)")

    # ------------------------------------------------------------------ finalizing
    def _take_for_finalize(self, pending: PendingCheckpoint) -> bool:
        """Call with `_lock` held. True if the caller must finalize `pending`."""
        if self._pending.get(pending.checkpoint_id) is not pending:
            return False
        del self._pending[pending.checkpoint_id]
        pending.mark_finalizing()
        self._remember(pending.checkpoint_id, "being finalized")
        return True

    def _finalize_if_complete(self, pending: PendingCheckpoint) -> None:
        with self._lock:
            finalize = pending.is_fully_acknowledged and self._take_for_finalize(pending)
        if finalize:
            self._finalize(pending)

    def _finalize(self, pending: PendingCheckpoint) -> None:
        checkpoint_id = pending.checkpoint_id
        with self._finalize_lock:
            latest = self.completed_store.latest()
            if latest is not None and latest.checkpoint_id >= checkpoint_id:
                # A newer checkpoint completed while this one waited for the lock.
                self._after_abort(pending, R.SUBSUMED)
                return
            completed_at = self._scheduler.now_ms()
            data = CompletedCheckpointData(
                job_name=self.job_name, checkpoint_id=checkpoint_id,
                trigger_timestamp_ms=pending.trigger_timestamp_ms,
                completion_timestamp_ms=completed_at,
                handles=pending.acknowledged_handles, properties=pending.properties)
            # (a) durable from here on
            try:
                self._storage.commit_metadata(pending.location, data)
            except LeaseLostError as e:
                self._fence(e, failed=pending)
                return
            except MetadataExistsError as e:
                # Someone else's _metadata: never delete it (seed 003, shared directory).
                self._after_abort(pending, R.FINALIZE_FAILED, e, delete_files=False)
                return
            except Exception as e:
                self._after_abort(pending, R.FINALIZE_FAILED, e)
                return
            # (b)
            pushed_out = self.completed_store.add(data)
            # (c)
            with self._lock:
                self._last_completion_ms = completed_at
                self._latest_completed_id = max(self._latest_completed_id, checkpoint_id)
                self._remember(checkpoint_id, "completed")
                older = [p for cid, p in self._pending.items() if cid < checkpoint_id]
                for p in older:
                    del self._pending[p.checkpoint_id]
                    p.abort(R.SUBSUMED)
            self.failure_manager.handle_success(checkpoint_id)
            self.stats.report_completed(checkpoint_id, completed_at - pending.trigger_timestamp_ms,
                                        pending.state_size_bytes(), completed_at)
            log.info("completed checkpoint %d of job %s (%d bytes in %d ms)", checkpoint_id,
                     self.job_name, pending.state_size_bytes(),
                     completed_at - pending.trigger_timestamp_ms)
            for p in older:
                self._after_abort(p, R.SUBSUMED)
            # (d)
            try:
                self._gateway.notify_complete(checkpoint_id, data)
            except Exception:
                log.exception("notifying participants that checkpoint %d of job %s completed "
                              "failed; the checkpoint stays complete and the restore re-runs "
                              "the commits", checkpoint_id, self.job_name)
            pending.completion_future.set_result(data)
            # (e)
            if pushed_out and not self._fenced:
                still_referenced = self.completed_store.retained_handles() + self._in_flight_handles()
                for old in pushed_out:
                    try:
                        self._storage.discard_completed(old.checkpoint_id, still_referenced)
                    except LeaseLostError as e:
                        self._fence(e, checkpoint_id=old.checkpoint_id)
                        break
                    except Exception as e:
                        log.warning("could not delete subsumed checkpoint %d of job %s: %s; "
                                    "its files stay until garbage collection", old.checkpoint_id,
                                    self.job_name, e)
        with self._lock:
            self._trigger_queued_request()

    def _in_flight_handles(self) -> list[StateHandle]:
        """Handles already acked for checkpoints still in flight: an incremental snapshot
        may reuse shared files of a checkpoint about to be discarded."""
        with self._lock:
            return [h for p in self._pending.values() for h in p.acknowledged_handles.values()]

    def _fence(self, error: LeaseLostError, failed: PendingCheckpoint | None = None,
               checkpoint_id: int | None = None) -> None:
        """Another run took over this job's checkpoint directory: stop everything, fail
        the job (not restartable), and never touch storage again. `failed` is the attempt
        that hit the lost lease, if any; else `checkpoint_id` names what storage was
        doing for. Idempotent: only the first call reports."""
        with self._lock:
            first = not self._fenced
            self._fenced = True
            self._shutdown = True
            self._periodic_scheduling = False
            self._trigger_request_queued = False
            self._cancel_periodic_trigger()
            others = self._take_all_pending(R.LEASE_LOST)
        if failed is not None:
            self._after_abort(failed, R.LEASE_LOST, error)
        elif first:
            self._failures.report(checkpoint_id, R.LEASE_LOST, error)
        for p in others:
            self._after_abort(p, R.LEASE_LOST, error)

    # ------------------------------------------------------------------ aborting
    def _abort_if_pending(self, pending: PendingCheckpoint, reason: R,
                          error: BaseException | None = None) -> None:
        with self._lock:
            if self._pending.get(pending.checkpoint_id) is not pending:
                return
            del self._pending[pending.checkpoint_id]
            pending.abort(reason)
        self._after_abort(pending, reason, error)

    def _take_all_pending(self, reason: R) -> list[PendingCheckpoint]:
        """Call with `_lock` held."""
        taken = [p for _, p in sorted(self._pending.items())]
        self._pending.clear()
        for p in taken:
            p.abort(reason)
        return taken

    def _after_abort(self, pending: PendingCheckpoint, reason: R,
                     error: BaseException | None = None, participant: ParticipantId | None = None,
                     detail: str | None = None, delete_files: bool = True) -> None:
        """Everything after an attempt left `_pending`. Call without `_lock`."""
        checkpoint_id = pending.checkpoint_id
        with self._lock:
            self._remember(checkpoint_id, f"aborted ({reason.name})")
        self._failures.report(checkpoint_id, reason, error, participant, detail)
        self._stop_writers_then_delete(checkpoint_id, reason, delete_files)
        if not pending.completion_future.done():
            pending.completion_future.set_exception(
                CheckpointFailedError(reason, checkpoint_id, detail or summarize_error(error)))
        with self._lock:
            self._trigger_queued_request()

    def _stop_writers_then_delete(self, checkpoint_id: int, reason: R, delete_files: bool) -> None:
        try:
            writers_stopped = self._gateway.abort(checkpoint_id, reason)
        except Exception as e:
            log.warning("could not cancel the snapshot work of checkpoint %d of job %s (%s); its "
                        "files are left for garbage collection", checkpoint_id, self.job_name, e)
            return
        if not delete_files:
            return

        def delete(done: Future[None]) -> None:
            if self._fenced:
                log.info("not deleting checkpoint %d of job %s: this run lost its lease",
                         checkpoint_id, self.job_name)
                return
            if done.cancelled() or done.exception() is not None:
                log.warning("writers of checkpoint %d of job %s may still be running (%s); its "
                            "files are left for garbage collection", checkpoint_id, self.job_name,
                            "cancelled" if done.cancelled() else done.exception())
                return
            try:
                self._storage.discard_location(checkpoint_id)
            except LeaseLostError as e:
                self._fence(e, checkpoint_id=checkpoint_id)
            except Exception as e:
                log.warning("could not delete the files of aborted checkpoint %d of job %s: %s; "
                            "they stay until garbage collection", checkpoint_id, self.job_name, e)

        writers_stopped.add_done_callback(delete)

    def _discard_unused_location(self, checkpoint_id: int) -> None:
        """A location created for an attempt that was never started: no writer exists."""
        with self._lock:
            self._remember(checkpoint_id, "refused before start")
        try:
            self._storage.discard_location(checkpoint_id)
        except Exception as e:
            log.warning("could not delete unused checkpoint directory chk-%d of job %s: %s",
                        checkpoint_id, self.job_name, e)

    def _trigger_queued_request(self) -> None:
        """Call with `_lock` held. Re-arms the periodic timer right away if a request was
        queued behind the attempts in flight."""
        if not self._trigger_request_queued:
            return
        self._trigger_request_queued = False
        if self._periodic_scheduling and not self._shutdown:
            self._cancel_periodic_trigger()
            self._periodic_trigger = self._scheduler.schedule_at_fixed_rate(
                0, self.config.interval_ms, self._on_periodic_timer)

    def _cancel_periodic_trigger(self) -> None:
        if self._periodic_trigger is not None:
            self._periodic_trigger.cancel()
            self._periodic_trigger = None

    def _remember(self, checkpoint_id: int, outcome: str) -> None:
        self._recent[checkpoint_id] = outcome
        self._recent.move_to_end(checkpoint_id)
        while len(self._recent) > _RECENT_OUTCOMES:
            self._recent.popitem(last=False)

    # ------------------------------------------------------------------ failures
    def _refuse(self, reason: R, detail: str | None = None) -> Future[CompletedCheckpointData]:
        """A trigger refused before any id was assigned: "not now"."""
        self._failures.report(None, reason, detail=detail)
        failed: Future[CompletedCheckpointData] = Future()
        failed.set_exception(CheckpointFailedError(reason, None, detail))
        return failed

    def _fail_before_start(self, checkpoint_id: int | None, reason: R,
                           error: BaseException | None) -> Future[CompletedCheckpointData]:
        if checkpoint_id is not None:
            with self._lock:
                self._remember(checkpoint_id, f"failed before start ({reason.name})")
        if isinstance(error, LeaseLostError):
            self._fence(error, checkpoint_id=checkpoint_id)
        else:
            self._failures.report(checkpoint_id, reason, error)
        failed: Future[CompletedCheckpointData] = Future()
        failed.set_exception(CheckpointFailedError(reason, checkpoint_id, summarize_error(error)))
        with self._lock:
            self._trigger_queued_request()
        return failed

    # ------------------------------------------------------------------ restore
    def restore_latest(self) -> CompletedCheckpointData | None:
        """Load the completed checkpoints from storage, move the id counter past every id
        ever used (completed or not), and return the latest, or None if there is none.
        Raises StorageError if storage cannot be read: the job must not start blind."""
        checkpoints = self._storage.load_completed()
        self.completed_store.recover(checkpoints)
        highest = max((c.checkpoint_id for c in checkpoints), default=None)
        if isinstance(self._storage, SupportsHighestCheckpointId):
            on_disk = self._storage.highest_checkpoint_id()
            if on_disk is not None:
                highest = on_disk if highest is None else max(highest, on_disk)
        if highest is not None:
            self._ids.set_count(highest + 1)
        latest = self.completed_store.latest()
        if latest is not None:
            self.failure_manager.handle_success(latest.checkpoint_id)
            with self._lock:
                self._latest_completed_id = max(self._latest_completed_id, latest.checkpoint_id)
            log.info("job %s restores from checkpoint %d (%d completed checkpoints found); next "
                     "checkpoint id is %d", self.job_name, latest.checkpoint_id, len(checkpoints),
                     self._ids.get())
        else:
            log.info("job %s has no completed checkpoint to restore from; next checkpoint id is %d",
                     self.job_name, self._ids.get())
        return latest
