"""The driver: job status, the epoch loop, checkpoints beside it, failover.

One epoch, on the main thread:
  1. take the barriers triggered since the last boundary (the coordinator's timer
     thread injects them); the barrier sits at the END of this epoch;
  2. plan a bounded slice per source split, read it, run the stateless steps and the
     stateful step in Spark (each subtask applies its rows to its RocksDB store in one
     vectorized call; with a barrier it also takes a hard-link checkpoint: the
     synchronous part), collect the output as Arrow, stage it in the sink;
  3. with a barrier: the remaining synchronous parts (positions, watermark, sink
     pre-commit) ack at once; the uploads of the subtasks' local checkpoints (the
     asynchronous part) run in the background while the next epochs run, and each
     acks or declines when done.

A checkpoint failure only fails that checkpoint. The job fails over (restore the
latest completed checkpoint, rewind sources, abort uncommitted sink output) when an
epoch fails or when the failure manager's tolerance is exceeded; the restart
strategy decides whether and when.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from sparkpoint.api.pipeline import Pipeline
from sparkpoint.checkpoint import (
    CheckpointCoordinator,
    CheckpointCoordinatorConfig,
    CheckpointFailureReason,
    ThreadScheduler,
)
from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.config import Settings
from sparkpoint.connectors.base import Positions, SourceContext
from sparkpoint.errors import (
    ConfigError,
    CorruptCheckpointError,
    JobFailedError,
    LeaseLostError,
    NoValidCheckpointError,
    SnapshotCancelled,
    SparkpointError,
)
from sparkpoint.ops.progress import ProgressReporter
from sparkpoint.runtime.gateway import RuntimeGateway, remove_local_checkpoints
from sparkpoint.runtime.restart import restart_strategy_from
from sparkpoint.runtime.spark import get_or_create_spark
from sparkpoint.runtime.stage import run_epoch
from sparkpoint.runtime.status import JobStatus, JobStatusTracker
from sparkpoint.runtime.subtask import EpochTask, local_checkpoint_dir, store_dir
from sparkpoint.runtime.storage_setup import JobStorage, open_job_storage
from sparkpoint.testing.participant_faults import ParticipantFaults

log = logging.getLogger(__name__)

JOB = "job"


class FailoverRequired(SparkpointError):
    pass


class RestoreFailed(SparkpointError):
    pass


@dataclass
class JobResult:
    status: JobStatus
    epochs: int
    records: int
    last_checkpoint_id: int | None
    restarts: int
    output: str | None
    checkpoint_dir: str
    failed_checkpoints: int = 0
    completed_checkpoints: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class JobMaster:
    def __init__(self, pipeline: Pipeline, settings: Settings, spark=None):
        pipeline.validate()
        self.pipeline = pipeline
        self.settings = settings
        self.job_name = settings.job_name
        self.source = pipeline.source_
        self.sink = pipeline.sink_
        self.operator = pipeline.stateful_
        self.P = settings.parallelism
        self.local_root = os.path.abspath(os.path.join(settings.local_state_dir, self.job_name))
        self.status = JobStatusTracker()
        self.run_id = uuid.uuid4().hex[:12]
        self._spark = spark
        self._stop = threading.Event()
        self._failover_reason: str | None = None
        self._fatal: BaseException | None = None
        self.faults = ParticipantFaults.from_rules(settings.faults)
        from sparkpoint.state.upload import FileHashCache

        self.hash_cache = FileHashCache()
        # progress state
        self.epoch = -1
        self.positions: Positions = {}
        self.max_event_time: int | None = None
        self.records = 0
        self.restarts = 0
        self.final_done = False
        self.restored_from: int | None = None
        self._bad_checkpoints: dict[int, str] = {}
        self._restore_futures: list[Future] = []
        from concurrent.futures import ThreadPoolExecutor

        self._restore_pool = ThreadPoolExecutor(2, thread_name_prefix="restore")

    # ------------------------------------------------------------------ participants
    @property
    def source_participant(self) -> str:
        return f"source:{self.source.name}"

    @property
    def sink_participant(self) -> str:
        return f"sink:{self.sink.name}"

    def state_participant(self, subtask: int) -> str:
        return f"state:{self.operator.name}/{subtask}"

    def participants(self) -> list[str]:
        ps = [JOB, self.source_participant, self.sink_participant]
        if self.operator is not None:
            ps += [self.state_participant(i) for i in range(self.P)]
        return ps

    # ------------------------------------------------------------------ set-up
    def _setup(self) -> None:
        s = self.settings
        self.storage: JobStorage = open_job_storage(
            s.checkpoint_dir, self.job_name, s.storage_options, run_id=self.run_id,
            lease_ttl_ms=s.lease_ttl_ms, fault_rules=s.faults, on_lease_lost=self._on_lease_lost)
        self.gateway = RuntimeGateway(self.participants(), self._on_checkpoint_complete)
        cfg = CheckpointCoordinatorConfig(
            interval_ms=s.checkpoint_interval_ms, min_pause_ms=s.checkpoint_min_pause_ms,
            timeout_ms=s.checkpoint_timeout_ms, max_concurrent=s.checkpoint_max_concurrent,
            tolerable_failed=s.tolerable_failed_checkpoints, num_retained=s.num_retained)
        self.scheduler = ThreadScheduler()
        self.coordinator = CheckpointCoordinator(
            self.job_name, cfg, self.scheduler, self.storage.ids, self.storage.checkpoints, self.gateway,
            fail_job=self._on_checkpoint_failures_exceeded)
        if s.alarm_webhook:
            from sparkpoint.checkpoint.alarms import WebhookAlarmListener
            self.coordinator.alarms.register(WebhookAlarmListener(s.alarm_webhook))
        if s.checkpointing_enabled:
            self.status.add_listener(lambda old, new, err: self.coordinator.job_status_changed(new.value))
        self.progress = ProgressReporter(self, enabled=s.progress, interval_ms=s.progress_interval_ms)
        if s.metrics_port:
            from prometheus_client import start_http_server
            start_http_server(s.metrics_port, addr="127.0.0.1", registry=self.coordinator.stats.registry)
        if self._spark is None:
            self._spark = get_or_create_spark(s.spark_master, f"sparkpoint:{self.job_name}", self.P, s.spark_conf)
        if self.operator is not None:
            from sparkpoint.runtime.user_code import ship_by_value

            ship_by_value(self.operator, getattr(self.operator, "_factory", None))
        if getattr(self.sink, "staging_dir", False) is None:
            # Sinks that stage rows durably between pre-commit and commit (Kafka) keep
            # them beside the job's checkpoints unless told otherwise.
            self.sink.staging_dir = f"{s.checkpoint_dir.rstrip('/')}/{self.job_name}/sinks/{self.sink.name}"
            if hasattr(self.sink, "staging_options") and not self.sink.staging_options:
                self.sink.staging_options = dict(s.storage_options)
        self.source.open(SourceContext(self._spark, self.job_name))
        self.sink.open(self.job_name)

    def _on_lease_lost(self, error: BaseException) -> None:
        self._fatal = error
        self._stop.set()

    def _on_checkpoint_failures_exceeded(self, reason: Any, error: Any = None) -> None:
        if getattr(reason, "fatal", False) or isinstance(error, LeaseLostError):
            self._on_lease_lost(error if isinstance(error, BaseException) else LeaseLostError(str(error)))
            return
        self._failover_reason = (f"tolerable failed checkpoints exceeded "
                                 f"({self.settings.tolerable_failed_checkpoints}); last: {getattr(reason, 'name', reason)}")

    # ------------------------------------------------------------------ public
    def cancel(self) -> None:
        self._stop.set()

    def trigger_checkpoint(self) -> Future:
        """A manual checkpoint: skips the min-pause and max-concurrent checks, like Flink's
        forced checkpoints. The future completes with the checkpoint's metadata."""
        log.info("manual checkpoint requested")
        return self.coordinator.trigger_checkpoint(forced=True)

    def run(self) -> JobResult:
        self._setup()
        prev_handlers = self._install_signal_handlers()
        try:
            return self._run_with_restarts()
        finally:
            self._teardown()
            for sig, h in prev_handlers.items():
                signal.signal(sig, h)

    def _install_signal_handlers(self) -> dict:
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                handlers[sig] = signal.getsignal(sig)
                signal.signal(sig, lambda *_: self.cancel())
            # `kill -USR1 <pid>`: take a manual (forced) checkpoint now.
            handlers[signal.SIGUSR1] = signal.getsignal(signal.SIGUSR1)
            signal.signal(signal.SIGUSR1, lambda *_: self.trigger_checkpoint())
        return handlers

    def _run_with_restarts(self) -> JobResult:
        strategy = restart_strategy_from(self.settings)
        while True:
            try:
                self._restore()
                self.status.transition(JobStatus.RUNNING)
                self._await_restore()
                self._epoch_loop()
                if self._fatal is not None:
                    raise self._fatal
                if self._stop.is_set() and not self.final_done:
                    self.status.transition(JobStatus.CANCELED)
                else:
                    self.status.transition(JobStatus.FINISHED)
                return self._result()
            except (LeaseLostError, NoValidCheckpointError, ConfigError) as e:
                # Not retryable: restarting would hit the same wall (or fight a newer run).
                self._fail(e)
                raise
            except Exception as e:  # an epoch failed, or checkpoint failures exceeded the tolerance
                if self._stop.is_set() and self._fatal is not None:
                    self._fail(self._fatal)
                    raise self._fatal
                self.status.transition(JobStatus.FAILING, e)
                log.warning("job %s failing over: %s", self.job_name, _summary(e))
                decision = strategy.on_failure()
                if not decision.restart:
                    self.status.transition(JobStatus.FAILED, e)
                    raise JobFailedError(f"job {self.job_name} failed and will not restart ({decision.why}): "
                                         f"{_summary(e)}") from e
                self.status.transition(JobStatus.RESTARTING)
                self.restarts += 1
                log.warning("restarting job %s in %d ms (%s)", self.job_name, decision.delay_ms, decision.why)
                if self._stop.wait(decision.delay_ms / 1000):
                    self.status.transition(JobStatus.CANCELED)
                    return self._result()

    def _fail(self, e: BaseException) -> None:
        if not self.status.status.terminal:
            if self.status.status == JobStatus.RUNNING:
                self.status.transition(JobStatus.FAILING, e)
            self.status.transition(JobStatus.FAILED, e)

    def _teardown(self) -> None:
        try:
            self.progress.close()
            self.coordinator.shutdown()
            self.gateway.shutdown()
            self.scheduler.shutdown()
            self._restore_pool.shutdown(wait=True, cancel_futures=True)
        finally:
            self.storage.close(release_lease=self._fatal is None)
            try:
                self.source.close()
                self.sink.close()
            except Exception:
                log.exception("closing connectors failed")

    def _result(self) -> JobResult:
        stats = self.coordinator.stats.snapshot()
        latest = self.coordinator.completed_store.latest()
        return JobResult(self.status.status, self.epoch + 1, self.records,
                         latest.checkpoint_id if latest else None, self.restarts,
                         getattr(self.sink, "path", None), self.storage.url,
                         failed_checkpoints=int(stats.get("counted_failed", 0)),
                         completed_checkpoints=int(stats.get("completed", 0)), extra={"stats": stats})

    # ------------------------------------------------------------------ restore
    def _restore(self) -> None:
        """Pick the latest completed checkpoint not known to be corrupt, rewind sources
        and recover the sink to it, and start restoring the subtasks' state in the
        background. While they restore, the job is RUNNING but its state participants
        are not: a checkpoint triggered then is declined as NOT_ALL_REQUIRED_TASKS_RUNNING,
        which is never counted as a failure (seed 002)."""
        self.gateway.abort_all_local()
        self.gateway.wait_idle()
        self.gateway.drain_commits()
        self._failover_reason = None
        self.final_done = False
        self._restore_futures = []
        self.coordinator.restore_latest()
        completed = list(reversed(self.coordinator.completed_store.all()))
        candidates = [c for c in completed if c.checkpoint_id not in self._bad_checkpoints]
        if candidates:
            self._restore_from(candidates[0])
            return
        if completed and self.settings.restore_mode != "empty":
            raise NoValidCheckpointError(
                f"job {self.job_name} has {len(completed)} completed checkpoint(s) in {self.storage.url} but none "
                f"restores: {'; '.join(self._bad_checkpoints.values())}. Nothing was started, so nothing was "
                f"lost. Inspect them with `sparkpoint doctor {self.settings.checkpoint_dir}`; to start from empty "
                f"state anyway, pass --set restore.mode=empty (sources replay from their start positions)")
        self._start_fresh()

    def _start_fresh(self) -> None:
        if not self.coordinator.completed_store.all():
            committed = getattr(self.sink, "committed_epochs", lambda: [])()
            if committed and self.settings.restore_mode != "empty":
                raise ConfigError(
                    f"the sink output {getattr(self.sink, 'path', '')} already holds committed output of "
                    f"{len(committed)} epoch(s), but job {self.job_name} has no checkpoint in "
                    f"{self.storage.url}: starting would mix two runs' output. Use an empty output directory, "
                    f"or the checkpoint directory of the run that wrote it")
        shutil.rmtree(self.local_root, ignore_errors=True)
        # Earlier restore attempts (of checkpoints that turned out corrupt) left the state
        # participants marked restoring; starting empty there is nothing to wait for.
        self.gateway.set_restoring([])
        self.epoch = -1
        self.max_event_time = None
        self.restored_from = None
        self.positions = self.source.initial_positions()
        self.sink.recover(None)
        log.info("job %s starts from scratch (%s)", self.job_name,
                 "no completed checkpoint" if not self._bad_checkpoints else
                 f"restore.mode=empty and none of the completed checkpoints restores: {sorted(self._bad_checkpoints)}")

    def _restore_from(self, data: CompletedCheckpointData) -> None:
        handles = data.handles
        job = handles[JOB]
        if self.operator is not None:
            missing = [i for i in range(self.P) if self.state_participant(i) not in handles]
            if missing:
                raise ConfigError(
                    f"checkpoint {data.checkpoint_id} of job {self.job_name} was taken with parallelism "
                    f"{_parallelism_of(handles, self.operator.name)}, this run has parallelism.default={self.P}; "
                    f"rescaling a restore is not supported yet: run with the checkpoint's parallelism")
            self.gateway.set_restoring([self.state_participant(i) for i in range(self.P)])
            self._restore_futures = [self._restore_pool.submit(self._restore_subtask, data, i)
                                     for i in range(self.P)]
        self.epoch = int(job["epoch"])
        self.max_event_time = job.get("max_event_time")
        self.restored_from = data.checkpoint_id
        self.positions = dict(handles[self.source_participant]["positions"])
        self.sink.recover(handles.get(self.sink_participant))
        log.info("job %s restores checkpoint %d (epoch %d)", self.job_name, data.checkpoint_id, self.epoch)

    def _restore_subtask(self, data: CompletedCheckpointData, subtask: int) -> None:
        from sparkpoint.state.restore import restore_snapshot

        participant = self.state_participant(subtask)
        self.faults.before_restore(participant)
        target = store_dir(self.local_root, self.operator.name, subtask)
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        local_copy = local_checkpoint_dir(self.local_root, self.operator.name, subtask, data.checkpoint_id)
        report = restore_snapshot(data.handles[participant], self.storage.fs, self.storage.layout, target,
                                  local_copy_dir=local_copy if os.path.isdir(local_copy) else None)
        if getattr(report, "corrupt_local", None):
            log.error("checkpoint %d, %s: the local recovery copy was corrupt (%s); those files were restored "
                      "from checkpoint storage instead", data.checkpoint_id, participant, report.corrupt_local)
        self.gateway.mark_ready(participant)

    def _await_restore(self) -> None:
        futures, self._restore_futures = self._restore_futures, []
        for fut in futures:
            try:
                fut.result()
            except CorruptCheckpointError as e:
                cid = self.restored_from
                self._bad_checkpoints[cid] = f"chk-{cid}: {e}"
                log.error("ALARM checkpoint %s of job %s is corrupt and is skipped; falling back to an older "
                          "retained checkpoint. %s", cid, self.job_name, e)
                raise RestoreFailed(f"checkpoint {cid} is corrupt: {e}") from e

    # ------------------------------------------------------------------ epoch loop
    def _watermark(self) -> int | None:
        wm = self.pipeline.watermark_
        if wm is None or self.max_event_time is None:
            return None
        return int(self.max_event_time) - wm.delay_ms

    def _epoch_loop(self) -> None:
        while not self._stop.is_set():
            if self._failover_reason:
                raise FailoverRequired(self._failover_reason)
            self.positions = self.source.discover(self.positions)
            exhausted = self.source.is_exhausted(self.positions)
            if exhausted:
                self._finish()
                return
            plan = self.source.plan(self.positions)
            if plan.empty and not self.gateway.has_barrier():
                self.progress.maybe_report()
                time.sleep(self.settings.idle_pause_ms / 1000)
                continue
            self._run_one_epoch(plan, final=False)

    def _run_one_epoch(self, plan, final: bool) -> None:
        barriers = self.gateway.take_barriers()
        checkpoint_id = barriers[-1].checkpoint_id if barriers else None
        # Several barriers between two boundaries share one snapshot; the older ones are
        # subsumed by the newest (declined as not counted).
        for older in barriers[:-1]:
            self.coordinator.decline(older.checkpoint_id, JOB, CheckpointFailureReason.SUBSUMED, None)
        epoch = self.epoch + 1
        df = self.source.read(plan)
        for step in self.pipeline.transforms:
            df = step(df)
        task = None
        if self.operator is not None:
            task = EpochTask(self.operator, self.local_root, epoch, self.P, self.settings.max_parallelism,
                             None if final else self._watermark(), int(time.time() * 1000), final, checkpoint_id,
                             self.faults.sync_failures(checkpoint_id, [self.state_participant(i) for i in range(self.P)]))
        wm_col = self.pipeline.watermark_.column if self.pipeline.watermark_ else None
        result = run_epoch(self._spark, df, task, wm_col, epoch)
        out = result.output
        for fn in self.pipeline.output_maps:
            out = fn(out)
        self.sink.write_epoch(epoch, out)
        # The epoch is done: advance.
        self.epoch = epoch
        self.positions = dict(plan.end)
        self.records += result.input_records
        if result.max_event_time_ms is not None:
            self.max_event_time = max(self.max_event_time or result.max_event_time_ms, result.max_event_time_ms)
        self.progress.on_epoch(result, out.num_rows)
        if checkpoint_id is not None:
            self._snapshot(checkpoint_id, result)

    def _finish(self) -> None:
        """End of a bounded input: fire everything (final watermark), then take a last
        checkpoint so the final output is committed."""
        if self.final_done:
            return
        self._run_empty_epoch()
        # Let checkpoints already in flight finish first, so the final one is not
        # declined as subsumed alongside them.
        deadline = time.monotonic() + self.settings.checkpoint_timeout_ms / 1000
        if not self._carry_barriers_until(lambda: not self.coordinator.pending_checkpoint_ids()
                                          or time.monotonic() > deadline):
            return
        # No periodic checkpoint may start now: it would only be aborted at shutdown and
        # show up as a failed checkpoint of a clean run. The final one is forced.
        self.coordinator.stop_scheduler()
        for attempt in range(1, 11):
            fut: Future = self.coordinator.trigger_checkpoint(forced=True)
            if not self._carry_barriers_until(fut.done):
                return  # stopped: the job ends CANCELED, its output uncommitted but staged
            try:
                fut.result()
            except Exception as e:
                log.warning("final checkpoint attempt %d failed: %s; retrying", attempt, _summary(e))
                time.sleep(min(5.0, 0.2 * attempt))
                continue
            self.final_done = True
            self.gateway.drain_commits()
            return
        raise FailoverRequired("the final checkpoint failed 10 times")

    def _run_empty_epoch(self) -> None:
        """An epoch with no input: fires what the final watermark releases and carries a barrier."""
        from sparkpoint.connectors.base import SlicePlan

        self._run_one_epoch(SlicePlan(dict(self.positions), dict(self.positions)), final=True)

    def _carry_barriers_until(self, done: Callable[[], bool]) -> bool:
        """Keep carrying barriers with empty epochs until `done()`. False if the job was
        stopped first; FailoverRequired if checkpoint failures call for a failover."""
        while not done():
            if self._failover_reason:
                raise FailoverRequired(self._failover_reason)
            if self._stop.is_set():
                return False
            if self.gateway.has_barrier():
                self._run_empty_epoch()
            else:
                time.sleep(0.02)
            self.progress.maybe_report()
        return True

    # ------------------------------------------------------------------ snapshots
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


def _summary(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    # Py4J errors carry the Python traceback of the worker; the last line names the cause.
    for line in reversed(text):
        if "Error" in line or "Exception" in line:
            return line.strip()[:400]
    return (text[-1] if text else type(e).__name__)[:400]


def _parallelism_of(handles, op_name: str) -> int:
    return sum(1 for k in handles if k.startswith(f"state:{op_name}/"))


def default_run_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
