"""The checkpoint coordinator: triggers checkpoints on a clock, collects acks and
declines, finalizes, and decides what a failure means. Knows nothing of Spark.

Lifecycle of one checkpoint
---------------------------
1. Trigger (periodic timer, or `trigger_checkpoint`): pre-checks in Flink's order
   (`trigger_decider.decide_trigger`) - shut down or suspended; periodic scheduling off
   (periodic triggers only); a request already queued; too many concurrent (a periodic
   request is queued); min pause not over (periodic triggers only: the trigger is moved
   to when the pause ends); then participants not running (`gateway.not_ready()`).
   Forced checkpoints skip the queued / concurrent / min-pause checks. A trigger that
   passes holds its place among the checkpoints in flight from here on, and its expiry
   timer (`timeout_ms`) is armed now, before any storage work.
2. Start, one trigger at a time: an id from the durable counter, then
   `storage.initialize_location(id)`. An id collision (a `chk-<id>/` left by a crashed
   run, seed 002) skips to a fresh id. Any error of the counter or of storage fails the
   trigger as IO_EXCEPTION (LEASE_LOST if fenced). If the trigger expired or was aborted
   while storage was busy (a hung storage call), it is never started: its failure
   was reported at the deadline, and the directory, if created late, is removed. Else
   the attempt is registered and `gateway.trigger` asks for the barrier.
3. Acks and declines arrive from any thread. Messages for attempts that are over, or
   for unknown ids, change nothing and fail nothing (seed 000).
4. Finalize, once every participant acked, in this order:
   a. write `_metadata` (exclusive create) - from here the checkpoint is durable;
      not started if the coordinator was suspended or shut down meanwhile;
   b. a checkpoint (never a savepoint) enters the completed store, which pushes out
      the oldest beyond retention;
   c. a checkpoint aborts older pending checkpoints (SUBSUMED; savepoints are never
      subsumed), reset the failure count, record stats;
   d. `gateway.notify_complete` (sources commit offsets, sinks commit), except for an
      intermediate savepoint: only a checkpoint or the savepoint a job stops with
      commits side effects (Flink's rule). A failover restores the latest checkpoint
      and replays what came after it, so output an intermediate savepoint committed
      would be published twice; the next checkpoint's cumulative handles commit it;
   e. only now delete the checkpoints pushed out in (b).
   A crash before (a) loses the attempt only; after (a) the checkpoint is restorable
   and the restore re-runs the sinks' commit (DESIGN.md §2). `suspend_and_settle`
   waits for finalizations past (a) to end, so a failover never restores around one.
5. Abort (decline, expiry, trigger error, finalize error, stop, shutdown): the attempt
   is removed, `failure_reporting` has the failure manager decide whether it counts,
   logs it and raises the alarm; `gateway.abort` stops its writers (never before its
   `gateway.trigger` returned), and only when that future completes are its files
   deleted (seed 000): with `SupportsDiscardAborted` storage also the shared files its
   handles reference that nothing kept references (else they would stay until garbage collection).

Threads and locks
-----------------
`_lock` guards the coordinator's state and is held only for in-memory work: the
gateway, storage, id counter, failure manager, alarm listeners, `live_references` and
futures are never called while holding it (scheduler calls and the stats tracker's
`report_triggered` are: schedulers never run a timer inline, stats only observe).
The trigger turn (`_acquire_trigger_turn`, a condition on `_lock`) serializes step 2 so
ids reach the participants in order; a trigger waiting for its turn gives up when it
expires. A trigger that expires (or is aborted) while it holds the turn, stuck in a
storage call, hands the turn on at once: it can never reach the participants, so the
next trigger goes ahead, and the stuck thread, once storage answers, only cleans up.
`_finalize_lock` serializes step 4 so completions are recorded in id order.
Order: trigger turn, then `_finalize_lock` (only when a gateway acks synchronously
inside `trigger`), then `_lock`. Callbacks the coordinator calls (`fail_job`, alarm
listeners, gateway methods) may call back into it - stop, suspend, shut down, ack,
decline - but must not trigger a checkpoint synchronously.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Callable, Mapping, Sequence

from sparkpoint.checkpoint.alarms import AlarmBus, summarize_error
from sparkpoint.checkpoint.completed_store import CompletedCheckpointStore
from sparkpoint.checkpoint.config import CheckpointCoordinatorConfig
from sparkpoint.checkpoint.exceptions import (
    CheckpointFailedError,
    CheckpointsStillFinalizingError,
    CoordinatorShutDownError,
)
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
    SupportsDiscardAborted,
    SupportsHighestCheckpointId,
    SupportsSavepointComplete,
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

LiveReferences = Callable[[], Sequence[StateHandle]]


class _StartFailed(Exception):
    def __init__(self, checkpoint_id: int | None, reason: R, error: BaseException | None):
        self.checkpoint_id, self.reason, self.error = checkpoint_id, reason, error


class _TriggerAttempt:
    """A trigger that passed its pre-checks and is not yet a `PendingCheckpoint`: waiting
    for its turn or for storage. It counts as in flight, and its expiry is armed. Its
    fields change only under the coordinator's `_lock`."""

    def __init__(self, props: CheckpointProperties, started_ms: int) -> None:
        self.props = props
        self.started_ms = started_ms
        self.stage = "its turn (another trigger is talking to storage)"
        self.checkpoint_id: int | None = None
        self.ended: R | None = None  # expired or aborted before it was registered
        self.expiry: Cancellable | None = None
        self.pending: PendingCheckpoint | None = None  # once registered
        self.future: Future[CompletedCheckpointData] = Future()


def _fail_job_not_configured(reason: R, error: BaseException) -> None:
    log.error("checkpoint failures call for failing the job, but the coordinator was built "
              "without fail_job: %s", error)


def _unexpected(error: BaseException, what: str, job_name: str) -> None:
    """An error that is not a StorageError from storage or the id counter: a bug there, or
    an error it does not wrap. The trigger fails typed; the traceback goes to the log."""
    if not isinstance(error, StorageError):
        log.error("unexpected %s from %s of job %s (the storage implementation should raise "
                  "StorageError); the checkpoint fails as IO_EXCEPTION", type(error).__name__,
                  what, job_name, exc_info=error)


class CheckpointCoordinator:
    def __init__(self, job_name: str, config: CheckpointCoordinatorConfig, scheduler: Scheduler,
                 id_counter: CheckpointIDCounter, storage: CheckpointStorage,
                 gateway: ParticipantGateway, *,
                 failure_manager: CheckpointFailureManager | None = None,
                 stats: CheckpointStatsTracker | None = None,
                 alarms: AlarmBus | None = None,
                 completed_store: CompletedCheckpointStore | None = None,
                 rng: random.Random | None = None,
                 fail_job: FailJob | None = None,
                 live_references: LiveReferences | None = None) -> None:
        """`fail_job(reason, error)` is called (never under a coordinator lock) when
        counted failures exceed the tolerance, or at once for a fatal reason
        (`reason.fatal`, LEASE_LOST: do not restart). Ignored if `failure_manager` is given.
        `live_references()` returns the state handles the running job still needs although
        no checkpoint references them yet; whenever files are deleted (subsumed and aborted
        checkpoints) they count as still referenced. If it raises, nothing shared is deleted.
        The id counter is started here and shut down by `shutdown()`."""
        self.job_name = job_name
        self.config = config
        self._scheduler = scheduler
        self._ids = id_counter
        self._storage = storage
        self._gateway = gateway
        self._live_references = live_references
        self.failure_manager = failure_manager or CheckpointFailureManager(
            config.tolerable_failed, fail_job or _fail_job_not_configured)
        self.stats = stats or CheckpointStatsTracker(job_name)
        self.alarms = alarms or AlarmBus()
        self.completed_store = completed_store or CompletedCheckpointStore(config.num_retained)
        self._rng = rng or random.Random()
        self._failures = FailureReporter(job_name, self.failure_manager, self.stats, self.alarms,
                                         scheduler.now_ms)

        self._lock = threading.Lock()
        # The trigger turn: one trigger talks to storage and the gateway at a time.
        # Re-entrant per thread (owner and depth). `_turn_holder` is the attempt that took
        # it; if that attempt ends before it is registered (expired or aborted while
        # storage hangs), the turn passes on at once and `_turn_generation` moves, so the
        # stalled thread's late release changes nothing.
        self._trigger_turn = threading.Condition(self._lock)
        self._trigger_owner: int | None = None
        self._trigger_depth = 0
        self._turn_holder: _TriggerAttempt | None = None
        self._turn_generation = 0
        # Re-entrant: a gateway may answer synchronously from inside a call we make
        # while holding it (e.g. ack inside `trigger`, which may finalize).
        self._finalize_lock = threading.RLock()
        self._settled = threading.Condition(self._lock)  # a finalization ended
        self._triggering: set[_TriggerAttempt] = set()
        self._pending: dict[int, PendingCheckpoint] = {}
        # Fully acknowledged, left `_pending`, not yet completed or aborted: id -> (attempt,
        # thread finalizing it).
        self._finalizing: dict[int, tuple[PendingCheckpoint, int]] = {}
        # Registered, `gateway.trigger` not yet returned: id -> (attempt, thread calling it).
        self._delivering: dict[int, tuple[PendingCheckpoint, int]] = {}
        # Aborted, waiting for their writers to stop before their files are deleted.
        self._aborting: dict[int, PendingCheckpoint] = {}
        self._recent: OrderedDict[int, str] = OrderedDict()
        self._periodic_trigger: Cancellable | None = None
        self._periodic_scheduling = False
        self._trigger_request_queued = False
        self._last_completion_ms: int | None = None
        self._latest_completed_id = -1
        self._shutdown = False
        self._suspended = False  # by suspend_and_settle, until the scheduler starts again
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
    def is_suspended(self) -> bool:
        return self._suspended

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
        jobs started together do not checkpoint in lockstep; then every interval.
        Ends a suspension (`suspend_and_settle`)."""
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
            self._suspended = False
            self._periodic_scheduling = True
            delay = self._rng.randint(lo, hi)
            self._periodic_trigger = self._scheduler.schedule_at_fixed_rate(
                delay, self.config.interval_ms, self._on_periodic_timer)
        log.info("periodic checkpoints of job %s start in %d ms, every %d ms",
                 self.job_name, delay, self.config.interval_ms)

    def resume(self) -> None:
        """End a suspension (`suspend_and_settle`) without starting periodic checkpoints:
        for jobs whose periodic checkpointing is disabled, which still take forced ones
        (e.g. the final checkpoint of a bounded input)."""
        with self._lock:
            self._suspended = False

    def stop_periodic_triggers(self) -> None:
        """No periodic checkpoint starts from now on (a queued request is dropped), and
        the checkpoints already in flight go on: for the end of a bounded input, which
        lets them complete before the forced final one."""
        with self._lock:
            self._stop_periodic_locked()

    def checkpoints_in_flight(self) -> bool:
        """A checkpoint is being triggered (waiting for storage), pending, or finalizing."""
        with self._lock:
            return bool(self._triggering or self._pending or self._finalizing)

    def stop_scheduler(self) -> None:
        """Stop periodic triggers and abort every pending checkpoint and every trigger
        still waiting for storage (not counted)."""
        self._stop_all(R.COORDINATOR_SUSPENDING)

    def suspend_and_settle(self, timeout_s: float) -> None:
        """For a failover, before restoring: stop the scheduler, abort every pending
        checkpoint and trigger (COORDINATOR_SUSPENDING, not counted), and wait until
        every finalization already in flight has ended - completed (its `_metadata`
        written, the completed store updated, `notify_complete` delivered) or aborted
        before writing `_metadata`. From the call on no checkpoint can complete and every
        trigger, forced or not, is refused, until `start_scheduler()` (or
        `job_status_changed("RUNNING")`).

        Called from a callback of a finalization (the runtime fails over from inside it),
        that finalization and those queued behind it are not waited for: the queued ones
        are aborted before `_metadata` once they run.

        Raises `CheckpointsStillFinalizingError` if finalizations are still running after
        `timeout_s` (storage hangs): then do not restore in this process."""
        with self._lock:
            self._suspended = True
            stopped = self._take_everything(R.COORDINATOR_SUSPENDING)
        self._report_stopped(stopped, R.COORDINATOR_SUSPENDING)
        me = threading.get_ident()
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                # Finalizations, and barriers being handed to the runtime (so that its
                # `trigger(id)` never arrives after this returns; `abort(id)` follows it).
                # Called from inside a finalization, the others wait for the finalize lock
                # this thread holds: they cannot be waited for, and they see the suspension
                # before writing `_metadata` once they get the lock.
                finalizing_here = any(t == me for _, t in self._finalizing.values())
                busy = list(self._delivering.items())
                if not finalizing_here:
                    busy += list(self._finalizing.items())
                waiting = sorted({cid for cid, (_, thread) in busy if thread != me})
                remaining = deadline - time.monotonic()
                if not waiting or remaining <= 0:
                    break
                self._settled.wait(remaining)
        if waiting:
            log.error("checkpoint(s) %s of job %s still finalizing %g s after the job left "
                      "RUNNING; checkpoint storage may hang. Not safe to restore in this "
                      "process", ", ".join(map(str, waiting)), self.job_name, timeout_s)
            raise CheckpointsStillFinalizingError(tuple(waiting), timeout_s)
        log.info("checkpoint coordinator of job %s suspended and settled: no checkpoint in "
                 "flight; latest completed is %s", self.job_name,
                 self._latest_completed_id if self._latest_completed_id >= 0 else "none")

    def shutdown(self) -> None:
        """Stop scheduling, abort pending checkpoints, shut down the id counter. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._shutdown = True
            stopped = self._take_everything(R.COORDINATOR_SHUTDOWN)
        self._report_stopped(stopped, R.COORDINATOR_SHUTDOWN)
        try:
            self._ids.shutdown()
        except Exception as e:
            log.warning("could not shut down the checkpoint id counter of job %s: %s", self.job_name, e)
        log.info("checkpoint coordinator of job %s shut down", self.job_name)

    def _stop_all(self, reason: R, error: BaseException | None = None) -> None:
        with self._lock:
            stopped = self._take_everything(reason)
        self._report_stopped(stopped, reason, error)

    def _take_everything(self, reason: R) -> tuple[list[_TriggerAttempt], list[PendingCheckpoint]]:
        """Stop periodic triggers; take every trigger and pending checkpoint. Call with
        `_lock` held, then `_report_stopped` without it."""
        self._stop_periodic_locked()
        return self._take_all_attempts(reason), self._take_all_pending(reason)

    def _report_stopped(self, stopped: tuple[list[_TriggerAttempt], list[PendingCheckpoint]],
                        reason: R, error: BaseException | None = None) -> None:
        attempts, aborted = stopped
        for attempt in attempts:
            self._fail_attempt(attempt, reason, error)
        for pending in aborted:
            self._after_abort(pending, reason, error)

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
        `periodic=True` is what the timer uses; it is refused while scheduling is off.
        Talks to storage in the calling thread; if storage hangs, this call returns at
        the latest when the checkpoint's timeout passes, with an EXPIRED future, unless
        this call itself is the one stuck inside storage."""
        return self._trigger(CheckpointProperties(forced=forced, periodic=periodic))

    def trigger_savepoint(self, target: str | None = None, *,
                          terminate: bool = False) -> Future[CompletedCheckpointData]:
        """A savepoint (Flink's semantics): forced (no min-pause, no max-concurrent check),
        written by the storage to `target` (its default place if None), and never
        subsumed by a later checkpoint, periodic or forced: it completes even if a newer
        checkpoint completed first. It never enters the completed store, so it does not
        count against `num_retained` and a failover restores from the job's checkpoints,
        not from it. The future completes with its data; `data.properties.target` says
        where it is.

        `terminate=True`: the savepoint of a stop-with-savepoint; the job ends with it,
        so its completion notifies participants to commit. An intermediate savepoint
        (the default) commits nothing; the next completed checkpoint does."""
        return self._trigger(CheckpointProperties(forced=True, periodic=False, savepoint=True, target=target,
                                                  terminate=terminate))

    def _trigger(self, props: CheckpointProperties) -> Future[CompletedCheckpointData]:
        attempt = _TriggerAttempt(props, self._scheduler.now_ms())
        with self._lock:
            refusal = self._precheck(props)
            if refusal is None:
                # In flight from here on (max concurrent), and its timeout runs from now:
                # a trigger stalled in storage expires like any checkpoint, never later.
                self._triggering.add(attempt)
                attempt.expiry = self._scheduler.schedule(self.config.timeout_ms,
                                                          lambda: self._expire(attempt))
        if refusal is not None:
            return self._refuse(refusal, future=attempt.future)
        try:
            not_ready = list(self._gateway.not_ready())
            participants = list(self._gateway.participants())
        except Exception as e:
            log.error("could not ask the runtime which participants of job %s run", self.job_name,
                      exc_info=e)
            if self._take_attempt(attempt):
                self._fail_attempt(attempt, R.TRIGGER_FAILED, e)
            return attempt.future
        if not_ready:
            shown = ", ".join(sorted(not_ready)[:5]) + (" ..." if len(not_ready) > 5 else "")
            if self._take_attempt(attempt):
                self._refuse(R.NOT_ALL_REQUIRED_TASKS_RUNNING, f"not running: {shown}", attempt.future)
            return attempt.future

        turn = self._acquire_trigger_turn(attempt)
        if turn is None:
            return attempt.future  # expired or aborted while waiting; already reported
        try:
            pending = self._start(attempt, participants)
        finally:
            self._release_trigger_turn(turn)
        if pending is not None and not participants:
            self._finalize_if_complete(pending)
        return attempt.future

    def _start(self, attempt: _TriggerAttempt,
               participants: list[ParticipantId]) -> PendingCheckpoint | None:
        """Step 2, holding the trigger turn. The registered attempt, or None."""
        try:
            allocated = self._allocate_location(attempt)
        except _StartFailed as f:
            if f.reason is R.LEASE_LOST:
                assert isinstance(f.error, LeaseLostError)
                taken = self._take_attempt(attempt)
                self._fence(f.error, checkpoint_id=f.checkpoint_id)  # reports LEASE_LOST once
                if taken:
                    self._fail_attempt(attempt, R.LEASE_LOST, f.error, checkpoint_id=f.checkpoint_id,
                                       report=False)
            elif self._take_attempt(attempt):
                self._fail_attempt(attempt, f.reason, f.error, checkpoint_id=f.checkpoint_id)
            else:
                log.info("checkpoint storage of job %s answered the trigger of checkpoint %s only "
                         "after it %s, with: %s", self.job_name, f.checkpoint_id,
                         "expired" if attempt.ended is R.EXPIRED else "was aborted",
                         summarize_error(f.error))
            return None
        if allocated is None:
            return None  # ended before its directory was asked for; already reported
        checkpoint_id, location = allocated
        with self._lock:
            started = attempt in self._triggering
            if started:
                self._triggering.discard(attempt)
                pending = PendingCheckpoint(checkpoint_id, attempt.started_ms, location,
                                            participants, attempt.props, attempt.future)
                attempt.pending = pending
                self._pending[checkpoint_id] = pending
                assert attempt.expiry is not None
                pending.set_expiry(attempt.expiry)
                pending.start_delivery()
                self._delivering[checkpoint_id] = (pending, threading.get_ident())
                self.stats.report_triggered(checkpoint_id)
        if not started:
            # Its failure was reported when it expired or was aborted; nobody was asked
            # to snapshot, so nothing but the directory exists.
            log.info("checkpoint %d of job %s is not started: it %s while checkpoint storage "
                     "was busy", checkpoint_id, self.job_name,
                     "expired" if attempt.ended is R.EXPIRED else "was aborted")
            self._discard_unused_location(checkpoint_id, f"{attempt.ended} before start")
            return None

        log.info("triggering checkpoint %d @ %d for job %s (%d participants%s)", checkpoint_id,
                 pending.trigger_timestamp_ms, self.job_name, len(participants),
                 ", forced" if attempt.props.forced else "")
        failure: Exception | None = None
        try:
            self._gateway.trigger(checkpoint_id, pending.trigger_timestamp_ms, location, attempt.props)
        except Exception as e:
            failure = e
        finally:
            with self._lock:
                deferred = pending.finish_delivery()
            for fn in deferred:
                self._run_logged(fn, f"cleanup of checkpoint {checkpoint_id}")
            with self._lock:
                del self._delivering[checkpoint_id]
                self._settled.notify_all()
        if failure is not None:
            self._abort_if_pending(pending, R.TRIGGER_FAILED, failure)
        return pending

    def _acquire_trigger_turn(self, attempt: _TriggerAttempt) -> int | None:
        """Wait for the trigger turn; the token to release it with. None if the attempt
        ended (expired, aborted) first. An attempt whose deadline has passed does not take
        a free turn: its expiry is due, and storage work for it would be thrown away."""
        me = threading.get_ident()
        with self._lock:
            while True:
                if attempt not in self._triggering:
                    return None
                due = attempt.started_ms + self.config.timeout_ms <= self._scheduler.now_ms()
                if self._trigger_owner == me or (self._trigger_owner is None and not due):
                    if self._trigger_owner is None:
                        self._trigger_owner = me
                        self._turn_holder = attempt
                        self._turn_generation += 1
                    self._trigger_depth += 1
                    return self._turn_generation
                self._trigger_turn.wait()

    def _release_trigger_turn(self, turn: int) -> None:
        with self._lock:
            if turn != self._turn_generation:
                return  # passed on while this thread was stuck in storage
            self._trigger_depth -= 1
            if self._trigger_depth == 0:
                self._free_trigger_turn()

    def _free_trigger_turn(self) -> None:
        """Call with `_lock` held."""
        self._trigger_owner = None
        self._trigger_depth = 0
        self._turn_holder = None
        self._trigger_turn.notify_all()

    def _pass_trigger_turn_on(self, ended: _TriggerAttempt) -> None:
        """`ended` will never reach the participants (it expired or was aborted before it
        was registered). If it holds the turn, its thread is stuck in storage: the turn
        goes to the next trigger now, instead of every later trigger expiring behind it
        until storage answers. Call with `_lock` held."""
        if self._turn_holder is ended:
            self._turn_generation += 1
            self._free_trigger_turn()

    def _take_attempt(self, attempt: _TriggerAttempt) -> bool:
        """True if the caller ends `attempt` (it was still triggering): then the caller
        must report it. False if an expiry or a stop ended it already."""
        with self._lock:
            if attempt not in self._triggering:
                return False
            self._triggering.discard(attempt)
            if attempt.expiry is not None:
                attempt.expiry.cancel()
            self._pass_trigger_turn_on(attempt)
            self._trigger_turn.notify_all()
            self._trigger_queued_request()  # it held a place among those in flight
            return True

    def _take_all_attempts(self, reason: R) -> list[_TriggerAttempt]:
        """Call with `_lock` held."""
        taken = list(self._triggering)
        self._triggering.clear()
        for attempt in taken:
            attempt.ended = reason
            if attempt.expiry is not None:
                attempt.expiry.cancel()
            self._pass_trigger_turn_on(attempt)
        self._trigger_turn.notify_all()
        return taken

    def _precheck(self, props: CheckpointProperties) -> R | None:
        """Ask the trigger policy and apply its answer. Call with `_lock` held."""
        decision = decide_trigger(props, TriggerState(
            now_ms=self._scheduler.now_ms(), shutdown=self._shutdown,
            periodic_scheduling=self._periodic_scheduling,
            request_queued=self._trigger_request_queued,
            # A checkpoint writing its `_metadata` is still in flight (Flink keeps it among
            # the pending ones until it completes): a trigger racing its completion could
            # fail and be counted before the completion resets the count.
            pending_count=len(self._pending) + len(self._triggering) + len(self._finalizing),
            max_concurrent=self.config.max_concurrent, last_completion_ms=self._last_completion_ms,
            min_pause_ms=self.config.min_pause_ms, suspended=self._suspended))
        if decision.queue_request:
            # The timer stays off while a request waits; the request fires when an attempt ends.
            self._trigger_request_queued = True
            self._cancel_periodic_trigger()
        if decision.retry_in_ms is not None:
            self._cancel_periodic_trigger()
            self._periodic_trigger = self._scheduler.schedule_at_fixed_rate(
                decision.retry_in_ms, self.config.interval_ms, self._on_periodic_timer)
        return decision.refusal

    def _set_stage(self, attempt: _TriggerAttempt, stage: str, checkpoint_id: int | None = None) -> bool:
        """Record what the attempt waits for; False if it has ended meanwhile."""
        with self._lock:
            attempt.stage = stage
            if checkpoint_id is not None:
                attempt.checkpoint_id = checkpoint_id
            return attempt.ended is None

    def _allocate_location(self, attempt: _TriggerAttempt) -> tuple[int, CheckpointLocation] | None:
        """A fresh id and its directory; None if the attempt ended (expired, aborted) before
        its directory was asked for.
        Raises _StartFailed."""
        collided: tuple[int, BaseException] | None = None
        for _ in range(MAX_ID_ATTEMPTS):
            if not self._set_stage(attempt, "checkpoint storage to hand out an id (id counter)"):
                return None
            try:
                checkpoint_id = self._ids.get_and_increment()
            except LeaseLostError as e:
                raise _StartFailed(None, R.LEASE_LOST, e) from e
            except Exception as e:
                _unexpected(e, "the checkpoint id counter", self.job_name)
                raise _StartFailed(None, R.IO_EXCEPTION, e) from e
            if not self._set_stage(attempt, f"checkpoint storage to create chk-{checkpoint_id}/",
                                   checkpoint_id):
                return None  # the counter answered after the deadline: the id stays unused
            try:
                if attempt.props.savepoint:
                    return checkpoint_id, self._initialize_savepoint(checkpoint_id, attempt.props.target)
                return checkpoint_id, self._storage.initialize_location(checkpoint_id)
            except LeaseLostError as e:
                raise _StartFailed(checkpoint_id, R.LEASE_LOST, e) from e
            except CheckpointIdCollision as e:
                log.info("chk-%d of job %s already exists (left by an earlier run or another "
                         "writer); skipping to a fresh checkpoint id", checkpoint_id, self.job_name)
                collided = (checkpoint_id, e)
                self._skip_ids_past(checkpoint_id)
            except Exception as e:
                # Not deleted: we cannot tell whether the directory is ours. Garbage
                # collection removes directories without _metadata.
                _unexpected(e, f"checkpoint storage creating chk-{checkpoint_id}/", self.job_name)
                raise _StartFailed(checkpoint_id, R.IO_EXCEPTION, e) from e
        assert collided is not None
        raise _StartFailed(collided[0], R.ID_COLLISION, collided[1])

    def _initialize_savepoint(self, checkpoint_id: int, target: str | None) -> CheckpointLocation:
        initialize = getattr(self._storage, "initialize_savepoint_location", None)
        if initialize is None:
            raise TypeError(f"the checkpoint storage of job {self.job_name} cannot write savepoints")
        return initialize(checkpoint_id, target)

    def _skip_ids_past(self, checkpoint_id: int) -> None:
        next_id = checkpoint_id + 1
        if isinstance(self._storage, SupportsHighestCheckpointId):
            try:
                highest = self._storage.highest_checkpoint_id()
            except Exception as e:
                log.info("could not list checkpoint ids of job %s (%s); probing the next id",
                         self.job_name, summarize_error(e))
                highest = None
            if highest is not None:
                next_id = max(next_id, highest + 1)
        try:
            self._ids.set_count(next_id)
        except LeaseLostError as e:
            raise _StartFailed(checkpoint_id, R.LEASE_LOST, e) from e
        except Exception as e:
            _unexpected(e, "the checkpoint id counter", self.job_name)
            raise _StartFailed(checkpoint_id, R.IO_EXCEPTION, e) from e

    # ------------------------------------------------------------------ messages
    def acknowledge(self, checkpoint_id: int, participant: ParticipantId, handle: StateHandle,
                    metrics: Mapping[str, Any] | None = None) -> AckResult:
        """A participant's snapshot for `checkpoint_id` is durable. The last ack finalizes
        the checkpoint in the calling thread (writes `_metadata`, notifies)."""
        finalize = False
        why = ""
        late = False
        aborted = False
        with self._lock:
            pending = self._pending.get(checkpoint_id)
            if pending is None:
                result, why = self._explain_unknown(checkpoint_id)
                aborting = self._aborting.get(checkpoint_id)
                # Its files are deleted with the aborted attempt's, once its writers stopped.
                late = aborting is not None and aborting.record_late_ack(participant, handle)
                aborted = late or self._recent.get(checkpoint_id, "").startswith("aborted")
            else:
                result = pending.acknowledge(participant, handle, metrics)
                if result is AckResult.SUCCESS and pending.is_fully_acknowledged:
                    finalize = self._take_for_finalize(pending)
        if result is AckResult.SUCCESS:
            self.stats.report_acknowledged(checkpoint_id, participant, self._scheduler.now_ms(), metrics)
        elif aborted:
            # Its snapshot was written all the same: the failed checkpoint's stats show it.
            self.stats.report_late_acknowledged(checkpoint_id, participant, self._scheduler.now_ms(), metrics)
        if result is AckResult.DUPLICATE:
            log.debug("duplicate ack for checkpoint %d from %s ignored", checkpoint_id, participant)
        elif result is AckResult.UNKNOWN and pending is not None:
            log.warning("ack for checkpoint %d from %s, which is not a participant of it; ignored",
                        checkpoint_id, participant)
        elif result is not AckResult.SUCCESS:
            log.debug("late ack for checkpoint %d from %s ignored: %s%s", checkpoint_id, participant,
                      why, "; its files are deleted with the aborted checkpoint's" if late else "")
        if finalize:
            assert pending is not None
            self._finalize(pending)
        return result

    def decline(self, checkpoint_id: int, participant: ParticipantId, reason: R,
                error: BaseException | None = None) -> bool:
        """A participant could not snapshot. Aborts the checkpoint and returns True, or
        returns False if the message is stale (the attempt is over or unknown): then
        nothing changes and nothing is counted (seed 000). A savepoint is never
        subsumed: declining one as SUBSUMED changes nothing either (False)."""
        with self._lock:
            pending = self._pending.get(checkpoint_id)
            refused = pending is not None and reason is R.SUBSUMED and pending.properties.savepoint
            if pending is None:
                _, why = self._explain_unknown(checkpoint_id)
            elif not refused:
                del self._pending[checkpoint_id]
                pending.abort(reason)
        if refused:
            log.warning("%s declined savepoint %d of job %s as SUBSUMED; ignored: a savepoint is never "
                        "subsumed, it stays pending until it is acknowledged, declined for another "
                        "reason or expires", participant, checkpoint_id, self.job_name)
            return False
        if pending is None:
            log.debug("decline of checkpoint %d by %s (%s) ignored: %s", checkpoint_id, participant,
                      reason.name, why)
            return False
        self._after_abort(pending, reason, error, participant)
        return True

    def _expire(self, attempt: _TriggerAttempt) -> None:
        """The attempt's timeout passed: it fails EXPIRED whether it is pending or still
        waiting for storage to start it (then it is never started)."""
        with self._lock:
            if attempt in self._triggering:
                self._triggering.discard(attempt)
                attempt.ended = R.EXPIRED
                self._pass_trigger_turn_on(attempt)
                self._trigger_turn.notify_all()
                pending = None
            else:
                pending = attempt.pending
                if pending is None or self._pending.get(pending.checkpoint_id) is not pending:
                    return
                del self._pending[pending.checkpoint_id]
                pending.abort(R.EXPIRED)
                missing = sorted(pending.not_yet_acknowledged)
        # The configured value in every expiry: a bare `timeout: 30` is 30 ms (Flink's
        # rule), and the message is where a person first sees what the job runs with.
        timeout = f"execution.checkpointing.timeout={self.config.timeout_ms} ms"
        if pending is None:
            self._fail_attempt(attempt, R.EXPIRED, detail=(
                f"{timeout} passed while the trigger was still waiting for "
                f"{attempt.stage}; it is never started"))
            return
        shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
        self._after_abort(pending, R.EXPIRED, detail=f"{timeout} passed with no ack from: {shown}")

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
        """Call with `_lock` held. True if the caller must finalize `pending` (in this
        thread: `suspend_and_settle` waits for it by thread)."""
        if self._pending.get(pending.checkpoint_id) is not pending:
            return False
        del self._pending[pending.checkpoint_id]
        pending.mark_finalizing()
        self._finalizing[pending.checkpoint_id] = (pending, threading.get_ident())
        self._remember(pending.checkpoint_id, "being finalized")
        return True

    def _finalize_if_complete(self, pending: PendingCheckpoint) -> None:
        with self._lock:
            finalize = pending.is_fully_acknowledged and self._take_for_finalize(pending)
        if finalize:
            self._finalize(pending)

    def _finalize(self, pending: PendingCheckpoint) -> None:
        try:
            with self._finalize_lock:
                self._finalize_in_order(pending)
        finally:
            with self._lock:
                if self._finalizing.get(pending.checkpoint_id, (None,))[0] is pending:
                    del self._finalizing[pending.checkpoint_id]
                self._settled.notify_all()
                self._trigger_queued_request()

    def _finalize_in_order(self, pending: PendingCheckpoint) -> None:
        """Step 4, holding `_finalize_lock`."""
        checkpoint_id = pending.checkpoint_id
        latest = self.completed_store.latest()  # checkpoints only
        if latest is not None and latest.checkpoint_id >= checkpoint_id and not pending.properties.savepoint:
            # A newer checkpoint completed while this one waited for the lock.
            self._after_abort(pending, R.SUBSUMED)
            return
        with self._lock:
            stopped = (R.LEASE_LOST if self._fenced else R.COORDINATOR_SHUTDOWN if self._shutdown
                       else R.COORDINATOR_SUSPENDING if self._suspended else None)
        if stopped is not None:
            # Suspended for a failover (or shut down) while waiting to finalize: nothing
            # may complete behind the restore's back. Never durable, so simply aborted.
            self._after_abort(pending, stopped, delete_files=stopped is not R.LEASE_LOST)
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
        # (b) Only checkpoints: a savepoint is self-contained, outside `chk-*`, and
        # never what a failover restores from, so it neither counts against the
        # retention of the job's checkpoints nor pushes one out (Flink's rule).
        is_savepoint = pending.properties.savepoint
        pushed_out = [] if is_savepoint else self.completed_store.add(data)
        # (c) A completed checkpoint makes older checkpoints in flight unnecessary, never
        # a savepoint (a person asked for it); a completed savepoint makes nothing
        # unnecessary, as it is not restored from.
        with self._lock:
            self._last_completion_ms = completed_at
            self._latest_completed_id = max(self._latest_completed_id, checkpoint_id)
            self._remember(checkpoint_id, "completed")
            older = [] if is_savepoint else [p for cid, p in self._pending.items()
                                             if cid < checkpoint_id and not p.properties.savepoint]
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
        if pending.properties.commits_side_effects:
            try:
                self._gateway.notify_complete(checkpoint_id, data)
            except Exception:
                log.exception("notifying participants that checkpoint %d of job %s completed "
                              "failed; the checkpoint stays complete and the restore re-runs "
                              "the commits", checkpoint_id, self.job_name)
        else:
            log.info("savepoint %d complete; its output is committed by the next checkpoint "
                     "(job %s keeps running)", checkpoint_id, self.job_name)
            if isinstance(self._gateway, SupportsSavepointComplete):
                try:
                    self._gateway.savepoint_complete(checkpoint_id, data)
                except Exception:
                    log.exception("telling the runtime that savepoint %d of job %s completed failed; "
                                  "the savepoint stays complete", checkpoint_id, self.job_name)
        pending.completion_future.set_result(data)
        # (e)
        if pushed_out and not self._fenced:
            still_referenced = self._still_referenced(f"the checkpoints subsumed by {checkpoint_id}",
                                                      exclude=pending)  # in the store already
            if still_referenced is None:
                return
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

    def _still_referenced(self, deleting: str,
                          exclude: PendingCheckpoint | None = None) -> list[StateHandle] | None:
        """Every handle whose files must survive a deletion: retained checkpoints, other
        checkpoints in flight (pending, or finalizing - they have left `_pending` but are not
        in the completed store yet), and the runtime's live references. None (delete no
        shared file) if the runtime cannot tell what it still needs."""
        handles = self.completed_store.retained_handles()
        with self._lock:
            in_flight = list(self._pending.values()) + [p for p, _ in self._finalizing.values()]
        handles += [h for p in in_flight if p is not exclude for h in p.acknowledged_handles.values()]
        if self._live_references is not None:
            try:
                handles += list(self._live_references())
            except Exception:
                log.exception("the runtime could not list the state files job %s still needs; "
                              "not deleting the shared files of %s (garbage collection removes "
                              "them later)", self.job_name, deleting)
                return None
        return handles

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
            stopped = self._take_everything(R.LEASE_LOST)
        if failed is not None:
            self._after_abort(failed, R.LEASE_LOST, error, delete_files=False)
        elif first:
            self._failures.report(checkpoint_id, R.LEASE_LOST, error)
        self._report_stopped(stopped, R.LEASE_LOST, error)

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
        """Everything after an attempt left `_pending`. Call without `_lock`. Whatever
        reporting raises, the writers are stopped, the files deleted and the future
        completed: a raising callback must not leave files or an open future behind."""
        checkpoint_id = pending.checkpoint_id
        with self._lock:
            self._remember(checkpoint_id, f"aborted ({reason.name})")
        try:
            self._failures.report(checkpoint_id, reason, error, participant, detail)
        finally:
            try:
                self._stop_writers_then_delete(pending, reason, delete_files and not self._fenced)
            finally:
                if not pending.completion_future.done():
                    pending.completion_future.set_exception(
                        CheckpointFailedError(reason, checkpoint_id, detail or summarize_error(error)))
                with self._lock:
                    self._trigger_queued_request()

    def _stop_writers_then_delete(self, pending: PendingCheckpoint, reason: R, delete_files: bool) -> None:
        """`gateway.abort`, once `gateway.trigger` returned; then, once the writers stopped,
        delete the files."""
        with self._lock:
            if delete_files:
                self._aborting[pending.checkpoint_id] = pending
            deferred = pending.after_delivery(lambda: self._stop_writers_now(pending, reason, delete_files))
        if not deferred:
            self._stop_writers_now(pending, reason, delete_files)

    def _stop_writers_now(self, pending: PendingCheckpoint, reason: R, delete_files: bool) -> None:
        checkpoint_id = pending.checkpoint_id
        try:
            writers_stopped = self._gateway.abort(checkpoint_id, reason)
        except Exception as e:
            log.warning("could not cancel the snapshot work of checkpoint %d of job %s (%s); its "
                        "files are left for garbage collection", checkpoint_id, self.job_name, e)
            self._forget_aborting(pending)
            return
        if not delete_files:
            return

        def delete(done: Future[None]) -> None:
            handles = self._forget_aborting(pending)
            if self._fenced:
                log.info("not deleting checkpoint %d of job %s: this run lost its lease",
                         checkpoint_id, self.job_name)
                return
            if done.cancelled() or done.exception() is not None:
                log.warning("writers of checkpoint %d of job %s may still be running (%s); its "
                            "files are left for garbage collection", checkpoint_id, self.job_name,
                            "cancelled" if done.cancelled() else done.exception())
                return
            self._discard_aborted(pending, handles)

        writers_stopped.add_done_callback(delete)

    def _forget_aborting(self, pending: PendingCheckpoint) -> list[StateHandle]:
        """No more late acks are collected for `pending`; its handles to discard."""
        with self._lock:
            if self._aborting.get(pending.checkpoint_id) is pending:
                del self._aborting[pending.checkpoint_id]
            return pending.handles_to_discard()

    def _discard_aborted(self, pending: PendingCheckpoint, handles: list[StateHandle]) -> None:
        """Its writers stopped: delete `chk-<id>/` and, if storage can, the shared files only
        its handles reference (else they stay until garbage collection)."""
        checkpoint_id = pending.checkpoint_id
        try:
            if handles and isinstance(self._storage, SupportsDiscardAborted):
                still_referenced = self._still_referenced(f"aborted checkpoint {checkpoint_id}",
                                                          exclude=pending)
                if still_referenced is not None:
                    self._storage.discard_aborted(checkpoint_id, handles, still_referenced)
                    return
            self._storage.discard_location(checkpoint_id)
        except LeaseLostError as e:
            self._fence(e, checkpoint_id=checkpoint_id)
        except Exception as e:
            log.warning("could not delete the files of aborted checkpoint %d of job %s: %s; "
                        "they stay until garbage collection", checkpoint_id, self.job_name,
                        summarize_error(e))

    def _discard_unused_location(self, checkpoint_id: int, outcome: str) -> None:
        """A location created for an attempt that was never started: no writer exists."""
        with self._lock:
            self._remember(checkpoint_id, outcome)
        if self._fenced:
            return
        try:
            self._storage.discard_location(checkpoint_id)
        except Exception as e:
            log.warning("could not delete unused checkpoint directory chk-%d of job %s: %s",
                        checkpoint_id, self.job_name, summarize_error(e))

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

    def _stop_periodic_locked(self) -> None:
        """Call with `_lock` held: no periodic trigger from now on, none queued."""
        self._trigger_request_queued = False
        self._periodic_scheduling = False
        self._cancel_periodic_trigger()

    def _cancel_periodic_trigger(self) -> None:
        if self._periodic_trigger is not None:
            self._periodic_trigger.cancel()
            self._periodic_trigger = None

    def _remember(self, checkpoint_id: int, outcome: str) -> None:
        self._recent[checkpoint_id] = outcome
        self._recent.move_to_end(checkpoint_id)
        while len(self._recent) > _RECENT_OUTCOMES:
            self._recent.popitem(last=False)

    def _run_logged(self, fn: Callable[[], None], what: str) -> None:
        try:
            fn()
        except Exception:
            log.exception("%s of job %s failed", what, self.job_name)

    # ------------------------------------------------------------------ failures
    def _refuse(self, reason: R, detail: str | None = None,
                future: Future[CompletedCheckpointData] | None = None) -> Future[CompletedCheckpointData]:
        """A trigger refused before any id was assigned: "not now"."""
        failed: Future[CompletedCheckpointData] = future or Future()
        try:
            self._failures.report(None, reason, detail=detail)
        finally:
            failed.set_exception(CheckpointFailedError(reason, None, detail))
        return failed

    def _fail_attempt(self, attempt: _TriggerAttempt, reason: R, error: BaseException | None = None,
                      detail: str | None = None, checkpoint_id: int | None = None,
                      report: bool = True) -> None:
        """An attempt that ended before it was started (its caller took it from
        `_triggering`): report, fail its future, let a queued request run."""
        with self._lock:
            attempt.ended = attempt.ended or reason
            if checkpoint_id is None:
                checkpoint_id = attempt.checkpoint_id
            if checkpoint_id is not None:
                self._remember(checkpoint_id, f"failed before start ({reason.name})")
        try:
            if report:
                self._failures.report(checkpoint_id, reason, error, detail=detail)
        finally:
            if not attempt.future.done():
                attempt.future.set_exception(
                    CheckpointFailedError(reason, checkpoint_id, detail or summarize_error(error)))
            with self._lock:
                self._trigger_queued_request()

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
