"""The driver: job status, the epoch loop, checkpoints beside it, failover.

The pipeline is a graph (runtime/graph.py): named sources, plain steps, stateful steps
and sinks. One epoch runs the whole graph once, on the main thread, in one numbered
method, `_run_one_epoch` (docs/runtime.md walks it): barriers, plan, read and run the
steps, sink staging, advance, acks; then the coordinator finalizes the checkpoint with
its last ack and the committer thread publishes it.

The JobMaster holds its collaborators and calls them; each gets only what it needs:
  - `JobPosition` (runtime/position.py): epoch, source positions, event times, counts;
  - `Snapshotter` (runtime/snapshots.py): takes the barriers, acks every participant;
  - `CheckpointCoordinator` (checkpoint/coordinator.py): triggers, collects acks, finalizes;
  - `Committer` (runtime/snapshots.py): what a completed checkpoint publishes and deletes;
  - `Restorer` and `StateRestore` (runtime/restore.py): which checkpoint to resume from,
    and every participant brought back to it;
  - `SavepointControl` (runtime/savepoints.py): stop requests and savepoint targets;
  - `EpochReplay` (runtime/epoch_replay.py): the epoch plan log, for sinks that cannot
    withdraw published output.

A checkpoint failure only fails that checkpoint. The job fails over (restore the
latest completed checkpoint, rewind sources, abort uncommitted sink output) when an
epoch fails or when the failure manager's tolerance is exceeded; the restart
strategy decides whether and when.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
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
    ThreadScheduler,
)
from sparkpoint.config import Settings
from sparkpoint.connectors.base import Positions, SlicePlan, SourceContext
from sparkpoint.errors import ConfigError, JobFailedError, LeaseLostError, NoValidCheckpointError
from sparkpoint.faults import ParticipantFaults
from sparkpoint.runtime.connect import check_server_runs_sparkpoint, is_connect
from sparkpoint.runtime.epoch_replay import EpochReplay
from sparkpoint.runtime.epoch_sizer import EpochSizer
from sparkpoint.runtime.progress import ProgressReporter
from sparkpoint.runtime.failures import (
    FailoverRequired,
    FailureSignature,
    PythonFailure,
    failing_step,
    failure_signature,
    is_config_error,
    may_be_permanent,
    python_failure,
)
from sparkpoint.runtime.failures import summarize as _summary
from sparkpoint.runtime.gateway import RuntimeGateway
from sparkpoint.runtime.restart import restart_strategy_from
from sparkpoint.runtime.restore import Restorer, StateRestore, restore_refusal
from sparkpoint.runtime.participants import all_participants, sink_participant, source_participant, \
    state_participant, step_participants
from sparkpoint.runtime.savepoints import SavepointControl, StopEpochs, StopOutcome, StopRequest, savepoint_path
from sparkpoint.runtime.snapshots import Committer, Snapshotter, live_state_handles
from sparkpoint.runtime.state_schemas import StateSchemas
from sparkpoint.runtime.spark import await_executors, create_session, is_local, master_to_create, session_master
from sparkpoint.runtime.graph import EventTimes, JobGraph
from sparkpoint.runtime.graph_epoch import run_graph_epoch
from sparkpoint.runtime.position import JobPosition, join_plans, split_plan
from sparkpoint.runtime.status import JobStatus, JobStatusTracker
from sparkpoint.runtime.executor.storage import StorageRef
from sparkpoint.runtime.executor.state import job_local_root
from sparkpoint.runtime.executor.store_opening import EpochInput, slice_identity
from sparkpoint.runtime.executor.subtask import EpochTask
from sparkpoint.runtime.lineages import Lineages
from sparkpoint.runtime.storage_setup import open_job_storage
from sparkpoint.redaction import mask_url
from sparkpoint.state.memory import StateMemory

log = logging.getLogger(__name__)



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
        for warning in settings.unit_warnings:
            log.warning("%s", warning)
        self.job_name = settings.job_name
        # The graph's named parts: each source, stateful step and sink is one participant of
        # every checkpoint (a step one per subtask), by its name.
        self.graph = JobGraph.of(pipeline)
        self.sources: dict[str, Any] = {n.name: n.source for n in self.graph.sources}
        self.sinks: dict[str, Any] = {n.name: n.sink for n in self.graph.sinks}
        self.operators: dict[str, Any] = {n.name: n.operator for n in self.graph.steps}
        # The first of each: the only one of a linear pipeline (progress, REST and tools show it).
        self.source = next(iter(self.sources.values()))
        self.sink = next(iter(self.sinks.values()))
        self.operator = next(iter(self.operators.values()), None)
        self.P = settings.parallelism
        # On executors' own disks. A relative path means "relative to each executor's
        # working directory" on a cluster, and to the driver's on local[*] (same disk).
        # Keyed by the checkpoint location too: runs of one name with different
        # checkpoint directories must not share stores.
        checkpoints = settings.checkpoint_dir if "://" in settings.checkpoint_dir else os.path.abspath(
            settings.checkpoint_dir)
        local = job_local_root(settings.local_state_dir, self.job_name, checkpoints)
        # A session handed to the job keeps its own master; else spark.master, spark-submit's, local[2].
        self.spark_master = ((session_master(spark) if spark is not None else None)
                             or master_to_create(settings.spark_master))
        self.local_root = os.path.abspath(local) if is_local(self.spark_master) else local
        self.state_memory = StateMemory.from_settings(settings)  # each Python worker's, shipped with its tasks
        if self.operators:
            m = self.state_memory
            log.info("job %s: keyed state may take %s per Spark Python worker, outside spark.executor.memory "
                     "(state.backend.rocksdb.memory.*; docs/memory.md sizes executors for it)", self.job_name,
                     f"{m.fixed_per_slot >> 20} MB" if m.managed else "unbounded memory")
        self.status = JobStatusTracker()
        self.run_id = uuid.uuid4().hex[:12]
        self._spark = spark
        self._owns_spark = False  # this job started the Spark session (and its JVM)
        self._stop = threading.Event()
        self._stop_signalled = False
        self._signal_stop: Future | None = None  # the stop a SIGINT/SIGTERM asked for
        self._signal_stop_name = ""
        self._signal_stop_failures = 0
        self.cancelled_after: str | None = None  # the failure a cancel during the restart backoff cut short
        self._requests: queue.SimpleQueue = queue.SimpleQueue()  # to the control thread; None stops it
        # Stop requests (to the epoch loop) and savepoint targets.
        self.savepoints = SavepointControl(self.job_name, settings, self.status, self._stop)
        self._failover_reason: str | None = None
        self._fatal: BaseException | None = None
        self.faults = ParticipantFaults.from_rules(settings.faults)
        self.lineages_of: dict[str, Lineages] = {
            name: Lineages(name, self.P, settings.max_parallelism,
                           materialize_interval_ms=settings.materialize_interval_ms,
                           max_changelogs=settings.materialize_max_changelogs) for name in self.operators}
        self.lineages = next(iter(self.lineages_of.values()), None)
        # Where the job is: epoch, source positions, event times, record counts (runtime/position.py).
        self.position = JobPosition(self.sources, EventTimes(self.graph))
        self.late_dropped_by_step: dict[str, int] = {name: 0 for name in self.operators}  # in this run
        # subtask per Spark task of each step, from its last epoch (stage.run_epoch)
        self._worker_order: dict[str, list[int] | None] = {name: None for name in self.operators}
        # Rehearsals that fail the executors' storage writes of a given checkpoint need its
        # barrier inside an epoch; otherwise checkpoints complete at the end of the epoch
        # they were triggered in (`Snapshotter.at_epoch_end`).
        self._ack_at_epoch_end = not any(isinstance(r, dict) and "checkpoints" in r and "participant" not in r
                                         for r in settings.faults)
        self.restarts = 0
        self.final_done = False
        self.restorer: Restorer | None = None  # with the Spark session and storage (_setup)
        if settings.epoch_target_ms:
            self.epoch_sizer: EpochSizer | None = EpochSizer(settings.epoch_target_ms)
        elif settings.epoch_ceiling_ms:
            self.epoch_sizer = EpochSizer.ceiling(settings.epoch_ceiling_ms)
        else:
            self.epoch_sizer = None
        self.epoch_plans = EpochReplay(None)  # with its log once storage is open (_setup)

    # ------------------------------------------------------------------ participants
    @property
    def source_participant(self) -> str:
        return source_participant(self.source.name)

    @property
    def sink_participant(self) -> str:
        return sink_participant(self.sink.name)

    def state_participant(self, subtask: int, step: str | None = None) -> str:
        return state_participant(step or self.operator.name, subtask)

    def step_participants(self, step: str) -> list[str]:
        return step_participants(step, self.P)

    def participants(self) -> list[str]:
        return all_participants(self.sources, self.sinks, self.operators, self.P)

    @property
    def restored_from(self) -> int | None:
        """The checkpoint (or savepoint) id the job last restored; None if it started fresh."""
        return self.restorer.restored_from if self.restorer is not None else None

    @property
    def stopped_with(self) -> str | None:
        """The savepoint the job stopped with."""
        return self.savepoints.stopped_with

    # ------------------------------------------------------------------ position (runtime/position.py)
    @property
    def epoch(self) -> int:
        """The last epoch that finished (-1: none yet)."""
        return self.position.epoch

    @property
    def source_positions(self) -> dict[str, Positions]:
        return self.position.source_positions

    @property
    def event_times(self) -> EventTimes:
        return self.position.event_times

    @property
    def records(self) -> int:
        """Input records, each counted once per run."""
        return self.position.records

    @property
    def replayed_records(self) -> int:
        """Input records that epochs re-run after a restore read again."""
        return self.position.replayed_records

    @property
    def positions(self) -> Positions:
        """The first source's positions (the only source of a linear pipeline)."""
        return self.source_positions.get(self.source.name, {})

    @property
    def max_event_time(self) -> int | None:
        """The largest event time any watermarked stream has seen."""
        return self.position.max_event_time()

    @property
    def late_dropped(self) -> int:
        """Rows the steps dropped as too late, in this run."""
        return sum(self.late_dropped_by_step.values())

    def source_lag(self) -> dict[str, int]:
        """Every source's lag per split (split names prefixed by the source when there are several)."""
        lag: dict[str, int] = {}
        for name, src in self.sources.items():
            positions = self.source_positions.get(name)
            if not positions:
                continue
            for split, n in dict(src.lag(positions) or {}).items():
                lag[str(split) if len(self.sources) == 1 else f"{name}/{split}"] = int(n)
        return lag

    # ------------------------------------------------------------------ set-up
    def _setup(self) -> None:
        s = self.settings
        self.storage, self._lease_keeper = open_job_storage(
            s.checkpoint_dir, self.job_name, s.storage_options, run_id=self.run_id,
            lease_ttl_ms=s.lease_ttl_ms, fault_rules=s.faults, on_lease_lost=self._on_lease_lost)
        self.gateway = RuntimeGateway(self.participants(), self._on_checkpoint_complete,
                                      on_commit_outcome=self._on_commit_outcome)
        if any(sink.needs_epoch_plans for sink in self.sinks.values()):  # cannot withdraw published output: log what each epoch ran
            from sparkpoint.storage.epoch_plans import EpochPlanLog

            self.epoch_plans = EpochReplay(EpochPlanLog(self.storage.fs, self.storage.layout))
        cfg = CheckpointCoordinatorConfig(
            interval_ms=s.checkpoint_interval_ms, min_pause_ms=s.checkpoint_min_pause_ms,
            timeout_ms=s.checkpoint_timeout_ms, max_concurrent=s.checkpoint_max_concurrent,
            tolerable_failed=s.tolerable_failed_checkpoints, num_retained=s.num_retained)
        self.scheduler = ThreadScheduler()
        self.coordinator = CheckpointCoordinator(
            self.job_name, cfg, self.scheduler, self.storage.ids, self.storage.checkpoints, self.gateway,
            fail_job=self._on_checkpoint_failures_exceeded,
            # State files the running job still needs but no checkpoint references yet.
            live_references=(lambda: live_state_handles(self.lineages_of)) if self.operators else None)
        # The epoch sequence's collaborators (docs/runtime.md): acks at the barrier, commits once complete.
        self.committer = Committer(self.job_name, self.storage, self.coordinator, self.gateway, self.sources,
                                   self.sinks, self.lineages_of, self.epoch_plans)
        self.state_schemas = StateSchemas(self.operators)
        self.snapshotter = Snapshotter(self.coordinator, self.gateway, self.faults, self.position, self.epoch_plans,
                                       self.sinks, self.lineages_of, s.storage_options,
                                       ack_at_epoch_end=self._ack_at_epoch_end, state_schemas=self.state_schemas)
        if s.alarm_webhook:
            from sparkpoint.checkpoint.alarms import WebhookAlarmListener
            self.coordinator.alarms.register(WebhookAlarmListener(s.alarm_webhook))
        if s.checkpointing_enabled:
            self.status.add_listener(lambda old, new, err: self.coordinator.job_status_changed(new.value))
        bound: set[type] = set()
        for src in self.sources.values():  # one set of metrics per kind of source on one registry
            if type(src) not in bound:
                src.bind_metrics(self.coordinator.stats.registry)
                bound.add(type(src))
        self.progress = ProgressReporter(self, enabled=s.progress, interval_ms=s.progress_interval_ms)
        if s.rest_enabled:  # REST API, dashboard, /metrics (also on metrics.prometheus.port); address in the lease
            from sparkpoint.runtime.rest import start_rest_server
            self.rest = start_rest_server(self)
            self.progress.announce(f"dashboard and REST API: {self.rest.address}/   (metrics: {self.rest.address}/metrics)")
        elif s.metrics_port:
            from prometheus_client import start_http_server
            start_http_server(s.metrics_port, addr=s.metrics_bind_address, registry=self.coordinator.stats.registry)
        if self._spark is None:
            self._owns_spark = True
            self._spark = create_session(self.spark_master, f"sparkpoint:{self.job_name}", self.P, s.spark_conf,
                                         remote=s.spark_remote)
        else:
            self._warn_settings_for_own_sessions()
        if is_connect(self._spark):
            check_server_runs_sparkpoint(self._spark)
        await_executors(self._spark, s.executor_registration_timeout_ms)
        from sparkpoint.runtime.user_code import ship_by_value

        for op in self.operators.values():
            ship_by_value(op, getattr(op, "_factory", None))
        url = s.checkpoint_dir if "://" in s.checkpoint_dir else os.path.abspath(s.checkpoint_dir)
        # Executors open checkpoint storage themselves (state files never pass the driver).
        self.storage_ref = StorageRef(url, self.job_name, dict(s.storage_options), tuple(s.faults))
        state = StateRestore(self._spark, self.local_root, self.storage_ref, self.state_memory, self.lineages_of,
                             s.max_parallelism, self.job_name, self.progress.announce)
        self.restorer = Restorer(job_name=self.job_name, settings=s, storage=self.storage, gateway=self.gateway,
                                 position=self.position, epoch_plans=self.epoch_plans, sources=self.sources,
                                 sinks=self.sinks, state=state, faults=self.faults, announce=self.progress.announce,
                                 state_schemas=self.state_schemas)
        self.writers = {name: sink.epoch_writer() for name, sink in self.sinks.items()}
        for name, sink in self.sinks.items():
            # Sinks that stage rows durably between pre-commit and commit (Kafka) keep them
            # beside the job's checkpoints unless told otherwise.
            sink.use_job_storage(f"{s.checkpoint_dir.rstrip('/')}/{self.job_name}/sinks/{name}",
                                 dict(s.storage_options))
        for src in self.sources.values():
            src.open(SourceContext(self._spark, self.job_name))
        for sink in self.sinks.values():
            sink.open(self.job_name)

    def _on_checkpoint_complete(self, checkpoint_id: int, data) -> None:
        """The gateway's committer thread, once `_metadata` is durable (runtime/snapshots.py)."""
        self.committer.on_complete(checkpoint_id, data)

    def _on_commit_outcome(self, checkpoint_id: int, error: BaseException | None) -> None:
        """The committer thread, after a completed checkpoint's commit ended. A failed one is
        made up for by the next commit (handles are cumulative); failing more than
        `sparkpoint.sink.tolerable-failed-commits` times in a row, the job fails over:
        output that stopped being published must not look like a healthy job."""
        streak = self.coordinator.stats.report_commit(failed=error is not None)
        limit = self.settings.tolerable_failed_commits
        if error is None or streak <= limit or self._failover_reason:
            return
        self._failover_reason = (
            f"the commits of {streak} completed checkpoints in a row failed, more than "
            f"sparkpoint.sink.tolerable-failed-commits={limit} (last: checkpoint {checkpoint_id}: "
            f"{_summary(error)}); the output stays staged and recovery publishes it")
        log.warning("job %s fails over: %s", self.job_name, self._failover_reason)

    def _warn_settings_for_own_sessions(self) -> None:
        """spark.master and spark.conf configure a session sparkpoint creates; the one
        handed to this job runs as its owner set it up."""
        s = self.settings
        if s.spark_master and s.spark_master != self.spark_master:
            log.warning("spark.master=%s is not used: the job runs in the Spark session it was given (master %s)",
                        s.spark_master, self.spark_master)
        if s.spark_conf:
            log.warning("spark.conf (%s) is not applied: the job runs in the Spark session it was given, with that "
                        "session's settings", ", ".join(sorted(s.spark_conf)))

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
    def trigger_savepoint(self, target: str | None = None) -> Future:
        """Take a savepoint now, the job keeps running; the future completes with its path
        (or URL). Its output is committed by the next checkpoint, not by it. ConfigError
        for a target outside the checkpoint directory and the allowed targets."""
        self.savepoints.check_target(target)
        log.info("savepoint requested%s", f" to {mask_url(target)}" if target else "")
        return savepoint_path(self.coordinator.trigger_savepoint(target), self.job_name)

    def stop(self, savepoint: bool = True, target: str | None = None) -> Future:
        """Stop the job with a savepoint (its path is the future's result) or, with
        `savepoint=False`, with a last checkpoint (result None). Ends FINISHED.
        ConfigError, before anything is queued, for a target outside the allowed places."""
        return self.savepoints.request_stop(savepoint, target)

    def stop_with_savepoint(self, target: str | None = None, *, savepoint: bool | None = None) -> Future:
        """`stop()` as the REST API calls it: a target implies a savepoint."""
        return self.stop(savepoint=target is not None if savepoint is None else savepoint, target=target)

    def cancel(self) -> None:
        self._stop.set()

    def trigger_checkpoint(self) -> Future:
        """A manual checkpoint: skips the min-pause and max-concurrent checks, like Flink's
        forced checkpoints. The future completes with the checkpoint's metadata."""
        log.info("manual checkpoint requested")
        return self.coordinator.trigger_checkpoint(forced=True)

    def run(self) -> JobResult:
        prev_handlers: dict = {}
        try:
            # Inside the try: a set-up that fails half-way (e.g. a sink's missing topic)
            # must still stop the lease keeper and release the lease, or every later run
            # is refused for as long as this process lives.
            self._check_local_state_dir()
            self._setup()
            prev_handlers = self._install_signal_handlers()
            return self._run_with_restarts()
        except BaseException as e:
            self.savepoints.settle(e)
            raise
        finally:
            self.savepoints.settle()  # before the REST server closes: callers fetch the answer
            self._teardown()
            for sig, h in prev_handlers.items():
                signal.signal(sig, h)

    def _install_signal_handlers(self) -> dict:
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            # The first Ctrl-C / SIGTERM stops the job with a last checkpoint, so it leaves a
            # committed state to resume from; a second one cancels at once. The handler only
            # queues (stop() puts on a SimpleQueue): the epoch loop does the work.
            for sig in (signal.SIGINT, signal.SIGTERM):
                handlers[sig] = signal.getsignal(sig)
                signal.signal(sig, self._on_stop_signal)
            # `kill -USR1 <pid>`: take a manual (forced) checkpoint now.
            # A signal handler runs on the main thread between any two bytecodes, possibly
            # while it holds the coordinator's or the gateway's lock: it only hands the
            # request to the control thread (SimpleQueue.put is safe there).
            if getattr(self, "_owns_spark", False):
                self._jvm_leaves_sigterm_to_the_driver()
            handlers[signal.SIGUSR1] = signal.getsignal(signal.SIGUSR1)
            signal.signal(signal.SIGUSR1, lambda *_: self._requests.put("checkpoint"))
            threading.Thread(target=self._serve_requests, name="sparkpoint-control", daemon=True).start()
        return handlers

    def _jvm_leaves_sigterm_to_the_driver(self) -> None:
        """A SIGTERM sent to the whole process group (systemd's control group, supervisord's
        stopasgroup, `kill -TERM -PGID`) also reaches the JVM, whose default handler runs the
        shutdown hooks and stops Spark in the middle of the stop the driver is carrying out.
        PySpark already starts the JVM ignoring SIGINT for the same reason; SIGTERM is ignored
        there too, so the driver decides. The JVM still ends with the driver: it exits when
        the driver's pipe to it closes."""
        if is_connect(self._spark):  # the server's JVM is no child of this process
            return
        try:
            jvm = self._spark.sparkContext._jvm
            jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal("TERM"), jvm.sun.misc.SignalHandler.SIG_IGN)
        except Exception as e:  # noqa: BLE001 - a JVM without sun.misc: a group stop may then cut it short
            log.info("could not make the Spark JVM leave SIGTERM to the driver (%s): a SIGTERM to the whole "
                     "process group stops Spark before the last checkpoint", _summary(e))

    def _on_stop_signal(self, signum, _frame) -> None:
        if self._stop_signalled or self.status.status != JobStatus.RUNNING:
            self.cancel()
            return
        self._stop_signalled = True
        self._signal_stop_name = signal.Signals(signum).name
        self._signal_stop = self.stop(savepoint=False)
        self._signal_stop.add_done_callback(self._stop_signal_done)
        self._requests.put(("signalled", self._signal_stop_name))

    def _stop_signal_done(self, fut: Future) -> None:
        if fut.exception() is not None and not self._stop.is_set():  # the user still wants it stopped
            log.warning("job %s: the last checkpoint of the stop failed (%s); cancelling", self.job_name,
                        _summary(fut.exception()))
            self.cancel()

    def _serve_requests(self) -> None:
        while (request := self._requests.get()) is not None:
            if isinstance(request, tuple) and request[0] == "signalled":
                self.progress.announce(f"{request[1]}: stopping with a last checkpoint so the next run resumes "
                                       f"from committed state (press Ctrl-C again to cancel at once)")
            elif request == "checkpoint":
                try:
                    self.trigger_checkpoint()
                except Exception:
                    log.exception("manual checkpoint request failed")

    def _run_with_restarts(self) -> JobResult:
        strategy = restart_strategy_from(self.settings)
        last: FailureSignature | None = None
        same = 0
        while True:
            in_epochs = False  # the failure came from an epoch that ran, not from restoring
            try:
                self._restore()
                self.status.transition(JobStatus.RUNNING)
                self._report_restore()
                if not self.settings.checkpointing_enabled:
                    self.coordinator.resume()  # no periodic checkpoints, but forced ones (the final one)
                in_epochs = True
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
                self.restorer.note_failure(e, self.coordinator.completed_store.all())
                self.status.transition(JobStatus.FAILING, e)
                failure = python_failure(e)
                trace = self._write_failure_trace(e)
                where = f" (full trace: {trace})" if trace else ""
                signature = failure_signature(e, self._failing_step(e), self.restored_from)
                if self._signal_stop is not None:
                    if self._stop_interrupted(failure, signature):
                        continue  # restore, then the queued stop takes its last checkpoint
                    return self._result()
                # Only the pipeline failing on its input, in an epoch that ran, is "the same
                # failure": a storage outage while restoring fails identically until it heals.
                if in_epochs and may_be_permanent(e):
                    same = same + 1 if signature == last else 1
                    last = signature
                else:
                    same, last = 0, None
                stop_why = None
                if is_config_error(failure):
                    stop_why = "a configuration error: restarting cannot fix it"
                elif self.settings.same_failure_max_attempts and same >= self.settings.same_failure_max_attempts:
                    origin = (f"restoring checkpoint {self.restored_from}" if self.restored_from is not None
                              else "starting from scratch")
                    stop_why = (f"it failed the same way {same} times in a row, each time after {origin}, so it "
                                f"fails on the same input every time (restart-strategy.same-failure.max-attempts="
                                f"{self.settings.same_failure_max_attempts})")
                if stop_why is not None:
                    self.status.transition(JobStatus.FAILED, e)
                    raise JobFailedError(f"job {self.job_name} stopped: {self._failure_line(failure, signature)}. "
                                         f"Not restarted: {stop_why}{where}") from None
                log.warning("job %s failing over: %s%s", self.job_name, self._failure_line(failure, signature), where)
                decision = strategy.on_failure()
                if not decision.restart:
                    self.status.transition(JobStatus.FAILED, e)
                    raise JobFailedError(f"job {self.job_name} failed and will not restart ({decision.why}): "
                                         f"{self._failure_line(failure, signature)}{where}") from None
                self.status.transition(JobStatus.RESTARTING)
                self.restarts += 1
                log.warning("restarting job %s in %d ms (%s)", self.job_name, decision.delay_ms, decision.why)
                if self._stop.wait(decision.delay_ms / 1000):
                    # Cancelled while it was failing: nothing was stopped cleanly, say so.
                    self.cancelled_after = self._failure_line(failure, signature)
                    self.status.transition(JobStatus.CANCELED)
                    return self._result()

    def _restore(self) -> None:
        """Restore the latest completed checkpoint not known to be corrupt (runtime/restore.py).

        First every checkpoint in flight settles: pending ones are aborted, and one whose
        `_metadata` is being written finishes (and is committed) or is aborted before it,
        so the restore sees the true latest checkpoint and no commit of a newer one can
        land after the sink recovered to an older one (that commit would publish output the
        restored state does not know of)."""
        self.coordinator.suspend_and_settle(self.settings.checkpoint_timeout_ms / 1000)
        self.gateway.abort_all_local()
        self.gateway.wait_idle()
        self.gateway.drain_commits()
        self._failover_reason = None
        self.final_done = False
        self.coordinator.restore_latest()
        try:
            self.restorer.restore(list(reversed(self.coordinator.completed_store.all())))
        except Exception as e:
            refusal = restore_refusal(e)
            if refusal is not None:  # the error's own line is what the job prints; this counts it
                self.coordinator.stats.report_restore_refused(refusal)
            raise
        # The sinks' recovery committed what the restored checkpoint staged: the failed
        # commits before it no longer count against the next ones.
        self.coordinator.stats.report_commit(failed=False)

    def _failing_step(self, e: BaseException) -> str | None:
        text = str(e)
        named = [n for n in self.operators if n in text]
        return failing_step(e, named[0] if named else self.operator.name if self.operator else None)

    def _report_restore(self) -> None:
        """The job runs again on restored state: count it (sparkpoint_checkpoint_restores_total)."""
        if self.restored_from is not None:
            self.coordinator.stats.report_restored(int(self.restored_from), int(time.time() * 1000),
                                                   external_path=self.restorer.restored_external)

    def _stop_interrupted(self, failure: PythonFailure, signature: FailureSignature) -> bool:
        """A signal asked the job to stop and the attempt failed meanwhile, typically
        because the signal reached the whole process group: Spark's Python workers died
        with it. The stop stays a stop: restore the latest checkpoint once and let the
        queued stop take its last checkpoint there (True); if that fails as well, end
        CANCELED with where the next run resumes (False). Never a failover verdict."""
        line = self._failure_line(failure, signature)
        self._signal_stop_failures += 1
        if self._signal_stop_failures == 1 and not self._stop.is_set():
            log.info("job %s: the stop was interrupted (%s); restoring the latest checkpoint to take the last "
                     "one there", self.job_name, line)
            self._requeue_signal_stop()
            self.status.transition(JobStatus.RESTARTING)
            return True
        latest = self._latest_completed_id()
        resume = (f"resume from checkpoint {latest}" if latest is not None
                  else "no checkpoint completed yet: the next run starts from scratch")
        self.progress.announce(f"stopped by {self._signal_stop_name}; the last checkpoint could not be taken "
                               f"({line}); {resume}")
        self.status.transition(JobStatus.CANCELED)
        return False

    def _requeue_signal_stop(self) -> None:
        """The signal's stop request goes first in the queue again (a failure while it
        carried its barriers took it out)."""
        self.savepoints.requeue(StopRequest(False, None, self._signal_stop))

    def _latest_completed_id(self) -> int | None:
        try:
            latest = self.coordinator.completed_store.latest()
        except Exception:  # noqa: BLE001 - only for a message
            return None
        return latest.checkpoint_id if latest is not None else None

    def _check_local_state_dir(self) -> None:
        """On a local master the driver's disk is the executors': a state.local.dir that
        cannot be a directory would fail every epoch on the executors, restart after
        restart. Checked before anything starts."""
        if not is_local(self.spark_master):
            return
        try:
            os.makedirs(self.local_root, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"state.local.dir={self.settings.local_state_dir!r}: cannot create the job's local "
                              f"state directory {self.local_root} ({e.strerror or e}); point state.local.dir at a "
                              f"writable directory") from None

    def _failure_line(self, failure: PythonFailure, signature: FailureSignature) -> str:
        parts = [failure.line()[:400]]
        if signature.step is not None:
            parts.append(f"in {signature.step}")
        parts += [n[:200] for n in failure.notes]  # e.g. the key and the record, when the raiser added them
        return "; ".join(parts)

    def _write_failure_trace(self, e: BaseException) -> str | None:
        """The whole failure (Python, Py4J and Java traces) goes to a file, so a restart
        logs one line. Under the job's checkpoint directory when it is local, else under
        the working directory; the newest 20 are kept."""
        import traceback

        if "://" in self.settings.checkpoint_dir:
            folder = os.path.abspath(os.path.join("sparkpoint-failures", self.job_name))
        else:
            folder = os.path.join(os.path.abspath(self.settings.checkpoint_dir), self.job_name, "failures")
        try:
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{time.strftime('%Y%m%dT%H%M%S')}-{self.run_id}-{self.restarts}.txt")
            with open(path, "w") as f:
                f.write(f"job {self.job_name}, run {self.run_id}, restored from {self.restored_from}, "
                        f"restart {self.restarts}\n\n")
                f.write("".join(traceback.format_exception(e)))
            for old in sorted(os.listdir(folder))[:-20]:
                os.remove(os.path.join(folder, old))
            return path
        except OSError as err:  # the trace is a convenience; the failure itself is logged
            log.info("could not write the failure trace to %s: %s", folder, err)
            return None

    def _fail(self, e: BaseException) -> None:
        if not self.status.status.terminal:
            if self.status.status == JobStatus.RUNNING:
                self.status.transition(JobStatus.FAILING, e)
            self.status.transition(JobStatus.FAILED, e)

    def _teardown(self) -> None:
        """Stops whatever `_setup` got to start (it may have failed half-way)."""
        self._requests.put(None)
        try:
            for part in ("progress", "coordinator", "gateway", "scheduler"):
                obj = getattr(self, part, None)
                if obj is not None:
                    obj.close() if part == "progress" else obj.shutdown()
        finally:
            if getattr(self, "_lease_keeper", None) is not None:
                self._lease_keeper.stop()
                self.storage.close(release_lease=self._fatal is None)
            for connector in (*self.sources.values(), *self.sinks.values()):
                try:
                    connector.close()
                except Exception:
                    log.exception("closing %s failed", connector.name)
            if getattr(self, "rest", None) is not None:
                self.rest.close()  # last: a stop's caller may still be fetching its outcome

    def _result(self) -> JobResult:
        stats = self.coordinator.stats.snapshot()
        latest = self.coordinator.completed_store.latest()
        return JobResult(self.status.status, self.epoch + 1, self.records,
                         latest.checkpoint_id if latest else None, self.restarts,
                         self.sink.location, self.storage.layout.root,
                         failed_checkpoints=int(stats.get("counted_failed", 0)),
                         completed_checkpoints=int(stats.get("completed", 0)),
                         extra={"stats": stats, "replayed_records": self.replayed_records,
                                "read_hint": self.sink.read_hint,
                                "malformed_records": sum(getattr(src, "malformed_records", 0)
                                                         for src in self.sources.values()),
                                "state": self.lineages.stats.to_json() if self.lineages else None,
                                "state_by_step": {n: lin.stats.to_json() for n, lin in self.lineages_of.items()},
                                "late_dropped_by_step": dict(self.late_dropped_by_step),
                                "outputs": {n: sink.location for n, sink in self.sinks.items()},
                                "savepoint": self.stopped_with,
                                "cancelled_after": self.cancelled_after,
                                "stopped_by_signal": self._signal_stop_name or None})

    def _savepoint_target(self, barrier):
        if barrier is None or not self.operators:
            return None
        from sparkpoint.runtime.executor.savepoint import SavepointTarget

        return SavepointTarget(barrier.location.url, dict(self.settings.storage_options))

    # ------------------------------------------------------------------ epoch loop
    def _watermark(self) -> int | None:
        """The job's watermark: the minimum over every watermarked stream (idle ones left out)."""
        return self.position.watermark(int(time.time() * 1000))

    def _epoch_loop(self) -> None:
        while not self._stop.is_set():
            if self._failover_reason:
                raise FailoverRequired(self._failover_reason)
            if self.restorer.restoring and self.savepoints.waiting(self._signal_stop):
                # Restored with a stop waiting (interrupted by the failure, or asked for
                # meanwhile): an epoch without input brings the state subtasks up first, or
                # they refuse the stop's checkpoint or savepoint as still restoring.
                self._run_empty_epoch(final=False)
            if self._serve_stop_request():
                return
            replay = self.epoch_plans.replay(self.epoch + 1)
            if replay is not None:  # published before a restore fell back: run it as first planned
                self._run_one_epoch(split_plan(SlicePlan(replay.start, replay.end), list(self.sources)),
                                    final=replay.final)
                continue
            for name, src in self.sources.items():
                self.source_positions[name] = src.discover(self.source_positions[name])
            if all(src.is_exhausted(self.source_positions[n]) for n, src in self.sources.items()):
                self._finish()
                return
            plans = {n: src.plan(self.source_positions[n]) for n, src in self.sources.items()}
            # The first epoch after a restore runs even with no input: until it has, the
            # state participants count as restoring and every checkpoint is refused.
            if all(p.empty for p in plans.values()) and not self.gateway.has_barrier() and not self.restorer.restoring:
                self.progress.maybe_report()
                time.sleep(self.settings.idle_pause_ms / 1000)
                continue
            plans, planned, size = self._sized(plans)
            started = time.monotonic()
            self._run_one_epoch(plans, final=False)
            if size is not None:
                self.epoch_sizer.observe(size, planned, time.monotonic() - started)

    def _serve_stop_request(self) -> bool:
        """Carry out a queued stop, if any (runtime/savepoints.py). True if the job stopped."""
        outcome = self.savepoints.serve(self.coordinator, self.progress,
                                        StopEpochs(self._carry_barriers_until, self._commit_final))
        if outcome is StopOutcome.STOPPED:
            self.final_done = True
        return outcome is not StopOutcome.KEEP_RUNNING

    def _sized(self, plans: dict[str, SlicePlan]):
        """The plans cut to the epoch sizer's budget; with the units planned and taken. With
        several sources the budget is over all their units and each source's slice is cut
        by the same fraction, so no input runs ahead of the others; a source that cannot
        count its plan's units is never cut."""
        if self.epoch_sizer is None:
            return plans, None, None
        sizes = {name: self.sources[name].plan_size(plan) for name, plan in plans.items()}
        planned = sum(n for n in sizes.values() if n)
        if not planned:
            return plans, None, None
        units = self.epoch_sizer.limit(planned)
        if units >= planned:
            return plans, planned, planned
        cut = dict(plans)
        for name, n in sizes.items():
            if n:
                cut[name] = self.sources[name].shrink(plans[name], max(1, n * units // planned))
        taken = sum(self.sources[name].plan_size(cut[name]) or 0 for name, n in sizes.items() if n)
        return cut, planned, taken

    def _run_one_epoch(self, plans: dict[str, SlicePlan], final: bool) -> None:
        """One epoch of the whole graph, the barrier at its end (docs/runtime.md):
          1. barriers: take those triggered since the last boundary (`Snapshotter.take_barriers`);
          2. plan: a replayed epoch as first planned (`EpochReplay`), else `plans` logged;
             every step's watermark fixed (`JobPosition.step_watermarks`);
          3. read every source's slice and run the steps (runtime/graph_epoch.py): each
             stateful step one Spark job, its state's change logs durable when it ends;
          4. sink staging: every sink stages this epoch's output;
          5. advance: positions, event times, counts (`JobPosition.advance`);
          6. acks: with a barrier, every participant acks (`Snapshotter.ack_barriers`).
        Then 7. finalize: the last ack makes the coordinator write `_metadata`
        (checkpoint/coordinator.py), in the thread that delivers it (with state: the
        gateway's asynchronous lane); 8. commits: the gateway's committer thread
        publishes the sinks' output and commits the sources' offsets
        (`Committer.on_complete`)."""
        # 1.
        barriers = self.snapshotter.take_barriers()
        checkpoint_id = barriers.checkpoint_id
        # 2.
        epoch = self.position.next_epoch
        replay = self.epoch_plans.replay(epoch)
        if replay is not None:  # whoever asked for an epoch here: this one is already published
            plans, final = split_plan(SlicePlan(replay.start, replay.end), list(self.sources)), replay.final
            now_ms = replay.processing_time_ms
        else:
            now_ms = int(time.time() * 1000)
        watermarks = self.position.step_watermarks(self.operators, now_ms, final)
        joined = join_plans(plans)
        if replay is None:
            self.epoch_plans.record(epoch, joined, final, None if final else self.position.watermark(now_ms), now_ms)
        self.restorer.before_first_epoch()
        savepoint_to = self._savepoint_target(barriers.savepoint)

        def make_task(node, output):
            lineages = self.lineages_of[node.name]
            return EpochTask(node.operator, self.local_root, epoch, self.P, self.settings.max_parallelism,
                             watermarks[node.name], now_ms, final, checkpoint_id,
                             self.storage_ref, lineages.for_tasks(), lineages.due_for_snapshot(), output,
                             self.faults.sync_failures(checkpoint_id, self.step_participants(node.name)),
                             savepoint_to=savepoint_to,
                             epoch_input=EpochInput(lineages.generation, slice_identity(joined.start, joined.end)),
                             memory=self.state_memory, initial_state=node.name in self.restorer.fresh_steps)

        # 3.
        result = run_graph_epoch(self._spark, self.graph, epoch, lambda node: self.sources[node.name].read(plans[node.name]),
                                 make_task, self._worker_order, self.writers)
        for name, step_result in result.steps.items():
            self._worker_order[name] = step_result.worker_order
            self.late_dropped_by_step[name] += sum(int(i.get("late_dropped") or 0) for i in step_result.infos.values())
            self.lineages_of[name].on_epoch(epoch, step_result.infos)
        self.restorer.first_epoch_done()
        # 4. A replayed epoch's output is published already by the sinks that keep an epoch
        # plan log (its state effects are applied above); the others withdrew it on restore.
        for name, sink in self.sinks.items():
            if replay is not None and sink.needs_epoch_plans:
                continue
            if name in result.sink_tables:
                sink.write_epoch(epoch, result.sink_tables[name])
            else:
                sink.stage_epoch(epoch, result.sink_handles.get(name, []))
        # 5. The epoch is done: advance.
        self.position.advance(epoch, plans, result.input_records, result.event_times, now_ms, watermarks, final)
        self.progress.on_epoch(result, result.output_rows, result.input_records)
        # 6.
        self.snapshotter.ack_barriers(barriers, result)

    def _finish(self) -> None:
        """End of a bounded input: one last epoch fires everything (the final watermark)
        and carries the barrier of a forced final checkpoint, so the final output is
        committed with it."""
        if self.final_done:
            return
        # No periodic checkpoint may start now: it would only be aborted at shutdown and
        # show up as a failed checkpoint of a clean run. The final one is forced.
        self.coordinator.stop_periodic_triggers()
        # Let checkpoints already in flight finish first, so the final one is not
        # declined as subsumed alongside them.
        deadline = time.monotonic() + self.settings.checkpoint_timeout_ms / 1000
        if not self._carry_barriers_until(lambda: not self.coordinator.checkpoints_in_flight()
                                          or time.monotonic() > deadline):
            return
        # Whatever outlived its timeout is aborted (not counted), not subsumed by the final one.
        self.coordinator.stop_scheduler()
        if self.restorer.restoring:
            # Restored at the end of the input: the state subtasks count as restoring until
            # an epoch has run, and would refuse the checkpoint.
            self._run_empty_epoch()
        for attempt in range(1, 11):
            # The barrier is queued before the final epoch runs: that epoch carries it.
            fut: Future = self.coordinator.trigger_checkpoint(forced=True)
            if not self._carry_barriers_until(fut.done):
                return  # stopped: the job ends CANCELED, its output uncommitted but staged
            try:
                fut.result()
            except Exception as e:
                log.warning("final checkpoint attempt %d failed: %s; retrying", attempt, _summary(e))
                time.sleep(min(5.0, 0.2 * attempt))
                continue
            self.final_done = self._commit_final()
            return
        raise FailoverRequired("the final checkpoint failed 10 times")

    # Retries of the final checkpoint's commit, and the pause before each (seconds).
    FINAL_COMMIT_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 4.0)

    def _commit_final(self) -> bool:
        """The final checkpoint (end of a bounded input, a stop) is committed before the job
        may say FINISHED: no later checkpoint would publish its output. A failed commit is
        retried with backoff; if it keeps failing the job fails over (recovery re-runs the
        commit of the restored checkpoint) and the restart strategy decides from there.
        The source's completion hook (offsets to the broker, dead letters published) runs
        again here, where a failure is not ignored. False if the job was cancelled first."""
        return self.committer.commit_final(self._stop, self.FINAL_COMMIT_BACKOFF_S)

    def _run_empty_epoch(self, final: bool = True) -> None:
        """An epoch with no input that carries a barrier; `final`: it also fires what the
        final watermark releases (end of a bounded input)."""
        self._run_one_epoch(self.position.empty_plans(), final=final)

    def _carry_barriers_until(self, done: Callable[[], bool], final: bool = True) -> bool:
        """Keep carrying barriers with empty epochs until `done()`. False if the job was
        stopped first; FailoverRequired if checkpoint failures call for a failover."""
        while not done():
            if self._failover_reason:
                raise FailoverRequired(self._failover_reason)
            if self._stop.is_set():
                return False
            if self.gateway.has_barrier():
                self._run_empty_epoch(final)
            else:
                time.sleep(0.02)
            self.progress.maybe_report()
        return True
