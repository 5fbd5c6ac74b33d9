"""Restoring a job (`Restorer`): which checkpoint, rewinding sources, recovering the
sinks, and handing each subtask's lineage to the executors (`StateRestore`).

The driver does no state I/O here: the restored checkpoint's lineages (snapshot +
change logs per subtask) become the lineages of the next epoch's tasks, and each
executor brings its local store to them in that first epoch (keeping a local copy
that is already there, else rebuilding it from checkpoint storage, verified). Until
that epoch is done the state participants count as restoring: a checkpoint
triggered meanwhile is declined as NOT_ALL_REQUIRED_TASKS_RUNNING, which is never
counted as a failure (seed 002)."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping, Sequence

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.checkpoint.reasons import RestoreRefusal
from sparkpoint.errors import (ConfigError, CorruptCheckpointError, CorruptSnapshotError, IncompatibleStateSchemaError,
                               NoValidCheckpointError, PublishedEpochsNotReplayableError)
from sparkpoint.runtime.epoch_replay import EpochReplay
from sparkpoint.runtime.failures import JOB, python_failure
from sparkpoint.runtime.failures import summarize as _summary
from sparkpoint.runtime.lineages import Lineages
from sparkpoint.runtime.participants import sink_participant, source_participant, state_by_step, \
    step_participants
from sparkpoint.runtime.position import JobPosition
from sparkpoint.storage.handles import checkpoint_file_entries

log = logging.getLogger("sparkpoint.runtime.jobmaster")

__all__ = ["Restorer", "StateRestore", "state_by_step", "corrupt_restored_checkpoint", "restore_refusal"]


def _refusal(error: BaseException, refusal: RestoreRefusal) -> BaseException:
    error.restore_refusal = refusal  # type: ignore[attr-defined]
    return error


def restore_refusal(e: BaseException) -> RestoreRefusal | None:
    """Why `e`, raised while restoring, refuses the restore; None if it is not a refusal."""
    explicit = getattr(e, "restore_refusal", None)
    if isinstance(explicit, RestoreRefusal):
        return explicit
    if isinstance(e, IncompatibleStateSchemaError):
        return RestoreRefusal.INCOMPATIBLE_STATE_SCHEMA
    if isinstance(e, PublishedEpochsNotReplayableError):
        return RestoreRefusal.UNREPLAYABLE_PUBLISHED_EPOCHS
    if isinstance(e, NoValidCheckpointError):
        return RestoreRefusal.NO_VALID_CHECKPOINT
    return None


def corrupt_restored_checkpoint(e: BaseException, restored: CompletedCheckpointData | None) -> bool:
    """An executor could not rebuild state from the restored checkpoint's files (missing
    or failing verification), so that checkpoint must never be restored again. Told by
    the exception's type (its traceback's last line), not by any word in the text: a
    storage outage's traceback may print a source line that raises it."""
    if restored is None or not (isinstance(e, CorruptSnapshotError)
                                or python_failure(e).short_type == CorruptSnapshotError.__name__):
        return False
    text = str(e)
    return any(entry.path in text for entry in checkpoint_file_entries(restored.handles))


class StateRestore:
    """Each stateful step's state brought to a checkpoint on the executors (Spark jobs):
    rebuilt as it was, or re-cut into another parallelism."""

    def __init__(self, spark: Any, local_root: str, storage_ref: Any, state_memory: Any,
                 lineages_of: Mapping[str, Lineages], max_parallelism: int, job_name: str,
                 announce: Callable[[str], None]):
        self.spark = spark
        self.local_root = local_root
        self.storage_ref = storage_ref  # this job's checkpoint storage, as executors open it
        self.state_memory = state_memory
        self.lineages_of = lineages_of
        self.max_parallelism = max_parallelism
        self.job_name = job_name
        self.announce = announce

    def check_max_parallelism(self, handles: dict, what: str) -> None:
        was = {h.get("max_parallelism") for h in handles.values() if isinstance(h, dict)}
        if was and was != {self.max_parallelism}:
            raise _refusal(ConfigError(
                f"{what} was taken with pipeline.max-parallelism={sorted(map(str, was))[0]}, this run has "
                f"{self.max_parallelism}: keys are spread over max-parallelism key groups, so it cannot "
                f"change across a restore. Run with --set pipeline.max-parallelism={sorted(map(str, was))[0]}"),
                RestoreRefusal.CHANGED_MAX_PARALLELISM)

    def redistribute(self, step: str, data: CompletedCheckpointData, old_handles: dict, source: Any,
                     savepoint: str | None) -> None:
        """Restore at another parallelism, or from a savepoint: the executors re-cut the
        old subtasks' key groups into this run's subtasks and upload each new subtask's
        state as a snapshot into this job's storage (runtime/executor/rescale.py)."""
        from sparkpoint.runtime.executor.rescale import RescaleTask
        from sparkpoint.runtime.stage import restore_state
        from sparkpoint.state.changelog import Lineage

        old = {i: Lineage.from_json(h) for i, h in old_handles.items()}
        covered = sorted(g for lin in old.values() for g in range(*lin.key_groups))
        if covered != list(range(self.max_parallelism)):
            raise CorruptCheckpointError(f"checkpoint {data.checkpoint_id}: the state of step "
                                         f"{step} does not cover every key group")
        lineages = self.lineages_of[step]
        parallelism = lineages.parallelism
        lineages.reset_empty()  # begins the restore's generation
        epoch = int(data.handles[JOB]["epoch"])
        task = RescaleTask(self.local_root, source, self.storage_ref, old, lineages.for_tasks(), epoch,
                           memory=self.state_memory, generation=lineages.generation)
        log.info("job %s re-cuts the state of %s from %d subtask(s) into %d", self.job_name, step,
                 len(old), parallelism)
        try:
            infos = restore_state(self.spark, task, parallelism)
        except CorruptSnapshotError as e:  # a storage outage is not corruption: it fails over as it is
            raise CorruptCheckpointError(f"checkpoint {data.checkpoint_id}: {e}") from e
        lineages.restore({j: infos[j]["lineage"] for j in range(parallelism)}, generation=task.generation)
        lineages.on_restore(infos)
        if len(old) != parallelism:
            self.announce(f"rescaled operator {step} from parallelism {len(old)} to {parallelism}")

    def rebuild(self, step: str, checkpoint_id: int) -> None:
        """Every subtask rebuilds the restored state on an executor from verified files,
        BEFORE the sink recovers: a checkpoint whose files are damaged is skipped while
        nothing has been touched yet (the sink's recovery may withdraw later output)."""
        from sparkpoint.runtime.executor.subtask import RestoreTask
        from sparkpoint.runtime.stage import restore_state

        lineages = self.lineages_of[step]
        task = RestoreTask(self.local_root, self.storage_ref, lineages.for_tasks(),
                           generation=lineages.generation, memory=self.state_memory)
        try:
            reports = restore_state(self.spark, task, lineages.parallelism)
        except CorruptSnapshotError as e:  # a storage outage is not corruption: it fails over as it is
            raise CorruptCheckpointError(f"checkpoint {checkpoint_id}: {e}") from e
        lineages.on_restore(reports)


class Restorer:
    """Brings the job to the latest completed checkpoint not known to be corrupt (or to a
    savepoint, or to nothing): its position, every step's state, every source's
    positions, every sink's staged output. Keeps what the job restored from, and whether
    its state subtasks are still restoring (until the first epoch after it is done)."""

    def __init__(self, *, job_name: str, settings: Any, storage: Any, gateway: Any, position: JobPosition,
                 epoch_plans: EpochReplay, sources: Mapping[str, Any], sinks: Mapping[str, Any],
                 state: StateRestore, faults: Any, announce: Callable[[str], None], state_schemas: Any = None):
        self.job_name = job_name
        self.settings = settings
        self.storage = storage
        self.gateway = gateway
        self.position = position
        self.epoch_plans = epoch_plans
        self.sources = sources
        self.sinks = sinks
        self.state = state
        self.faults = faults
        self.announce = announce
        self.state_schemas = state_schemas  # checks each step's recorded state schema against the pipeline's
        self.restored_from: int | None = None
        self.restored_external: str | None = None  # the savepoint restored, for the restore statistics
        self.restoring = False
        self.bad_checkpoints: dict[int, str] = {}
        # Steps that start on empty state (a fresh start, or new in the graph): their first
        # epoch applies their initial state (a processor's initial_state), once.
        self.fresh_steps: set[str] = set()

    @property
    def lineages_of(self) -> Mapping[str, Lineages]:
        return self.state.lineages_of

    def _step_participants(self) -> list[str]:
        return [p for step, lin in self.lineages_of.items() for p in step_participants(step, lin.parallelism)]

    def restore(self, completed: Sequence[CompletedCheckpointData]) -> None:
        """Restore the newest of `completed` (newest first) that restores, or a savepoint
        (execution.state-recovery.path), or start fresh. Every checkpoint in flight has
        settled before (JobMaster._restore)."""
        if self.settings.restore_mode == "empty":
            self.start_fresh(completed, ignoring=len(completed))
            return
        if self.settings.recovery_path and self._restore_savepoint(completed):
            return
        for data in completed:
            if data.checkpoint_id in self.bad_checkpoints:
                continue
            try:
                self._restore_from(data)
                return
            except CorruptCheckpointError as e:
                self.mark_bad(data.checkpoint_id, e)
        if completed:
            raise NoValidCheckpointError(
                f"job {self.job_name} has {len(completed)} completed checkpoint(s) in {self.storage.layout.root} but none "
                f"restores: {'; '.join(self.bad_checkpoints.values())}. Nothing was started, so nothing was "
                f"lost. Inspect them with `sparkpoint doctor {self.settings.checkpoint_dir}`; to start from empty "
                f"state anyway, pass --set restore.mode=empty (sources replay from their start positions)")
        self.start_fresh(completed)

    def start_fresh(self, completed: Sequence[CompletedCheckpointData], ignoring: int = 0) -> None:
        if not completed:
            for sink in self.sinks.values():
                committed = sink.committed_epochs()
                if committed and self.settings.restore_mode != "empty":
                    raise _refusal(ConfigError(
                        f"the sink output {sink.location} already holds committed output of "
                        f"{len(committed)} epoch(s), but job {self.job_name} has no checkpoint in "
                        f"{self.storage.layout.root}: starting would mix two runs' output. Use an empty output "
                        f"directory, or the checkpoint directory of the run that wrote it"),
                        RestoreRefusal.OUTPUT_WITHOUT_CHECKPOINT)
        self.gateway.set_restoring([])
        for lineages in self.lineages_of.values():
            lineages.reset_empty()
        self.fresh_steps = set(self.lineages_of)
        self.position.start_fresh(lambda name: self.sources[name].initial_positions())
        self.restored_from = None
        self.restored_external = None
        self.restoring = False
        self.storage.lease.check()  # a fenced run must not touch the sink's staged output
        for sink in self.sinks.values():
            sink.recover(None)
        self.epoch_plans.begin(None)
        where = ", ".join(str(sink.location) for sink in self.sinks.values())
        why = (f"restore.mode=empty: the {ignoring} completed checkpoint(s) in {self.storage.layout.root} are not "
               f"restored, sources replay from their start, and output committed by earlier runs of this job is "
               f"withdrawn from {where} so nothing is duplicated" if ignoring else
               "no completed checkpoint in " + self.storage.layout.root)
        log.info("job %s starts from scratch (%s)", self.job_name, why)
        self.announce(f"starting fresh: {why}")

    def _restore_savepoint(self, completed: list[CompletedCheckpointData]) -> bool:
        """`execution.state-recovery.path`: start from that savepoint, unless this job's
        own checkpoints already descend from it (a failover, or a rerun after a crash,
        resumes from those). True if it was restored.

        The job's own checkpoints come first, without reading the savepoint: under
        NO_CLAIM the savepoint is the user's to delete once the job has checkpoints of
        its own, and a failover must not depend on it."""
        from sparkpoint.runtime.executor.storage import StorageRef
        from sparkpoint.runtime.savepoints import savepoint_identity
        from sparkpoint.storage import savepoints

        path = self.settings.recovery_path
        own = [c for c in completed if c.checkpoint_id not in self.bad_checkpoints
               and (c.handles.get(JOB) or {}).get("origin_path") == path]
        origin = self.position.origin
        if own or (origin is not None and any((c.handles.get(JOB) or {}).get("origin") == origin
                                              for c in completed)):
            log.info("job %s already has checkpoints taken after starting from %s; resuming from those, "
                     "not from the savepoint", self.job_name, path)
            return False
        try:
            data, parent, name = savepoints.read(path, dict(self.settings.storage_options))
        except CorruptCheckpointError as e:
            raise NoValidCheckpointError(f"cannot start job {self.job_name} from {path}: {e}. Nothing was "
                                         "started; pass another savepoint") from e
        identity = savepoint_identity(data)
        if any((c.handles.get(JOB) or {}).get("origin") == identity for c in completed):
            log.info("job %s already has checkpoints taken after starting from %s; resuming from those, "
                     "not from the savepoint", self.job_name, path)
            return False
        try:
            self._restore_from(data, source=StorageRef(parent, name, dict(self.settings.storage_options)),
                               savepoint=path)
        except CorruptCheckpointError as e:
            raise NoValidCheckpointError(f"cannot start job {self.job_name} from {path}: {_summary(e)}. "
                                         "Nothing was started; pass another savepoint") from e
        self.position.origin = identity
        self.position.origin_path = path
        # New checkpoint ids continue after the savepoint's: sinks that remember the
        # last committed id (Kafka's commit marker) must not take new ones for old.
        self.storage.ids.set_count(max(self.storage.ids.get(), data.checkpoint_id + 1))
        return True

    def _restore_from(self, data: CompletedCheckpointData, source=None, savepoint: str | None = None) -> None:
        handles = data.handles
        job = handles[JOB]
        what = f"savepoint {savepoint}" if savepoint else f"checkpoint {data.checkpoint_id}"
        by_step = state_by_step(handles)
        self._check_step_identity(by_step, what)
        if self.state_schemas is not None:  # every step before any: a refusal leaves nothing half restored
            for name in self.lineages_of:
                if by_step.get(name):
                    self.state_schemas.check_restore(name, by_step[name], what)
        self.fresh_steps = {name for name in self.lineages_of if not by_step.get(name)}
        for name, lineages in self.lineages_of.items():
            old = by_step.get(name)
            if not old:  # a step new in the graph starts empty
                lineages.reset_empty(int(job["epoch"]))
                log.info("job %s: step %s has no state in %s; it starts empty", self.job_name, name, what)
                continue
            self.state.check_max_parallelism(old, savepoint or f"checkpoint {data.checkpoint_id}")
            if savepoint is None and sorted(old) == list(range(lineages.parallelism)):
                lineages.restore(old)
                self.state.rebuild(name, data.checkpoint_id)
            else:
                self.state.redistribute(name, data, old, source or self.state.storage_ref, savepoint)
        if self.lineages_of:
            self.gateway.set_restoring(self._step_participants())
            self.restoring = True
        self.restored_external = savepoint
        self.position.restore(job, {name: handles.get(source_participant(name)) for name in self.sources},
                              lambda name: self.sources[name].initial_positions(), what)
        self.restored_from = data.checkpoint_id
        self.storage.lease.check()  # a fenced run must not touch the sink's staged output
        for name, sink in self.sinks.items():
            if savepoint is not None:  # its sink handle may name files inside the savepoint
                sink.use_savepoint(savepoint, dict(self.settings.storage_options))
            sink.recover(handles.get(sink_participant(name)))
        # A savepoint starts a new line of epochs: what the job that took it published
        # after it is published again (docs/savepoints.md). A failover goes on with its own.
        self.epoch_plans.begin(job.get("history") if savepoint is None else None)
        published = [e for e in (s.published_epoch() for s in self.sinks.values() if s.needs_epoch_plans)
                     if e is not None]
        planned = [s for s in self.sinks.values() if s.needs_epoch_plans] or [next(iter(self.sinks.values()))]
        self.epoch_plans.prepare(self.position.epoch, max(published) if published else None, self.position.joined(),
                                 what, ", ".join(str(s.location or s.name) for s in planned),
                                 publish_again=self.settings.unreplayable_epochs == "publish-again")
        log.info("job %s restores %s (epoch %d)", self.job_name, what, self.position.epoch)
        taken = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(data.completion_timestamp_ms / 1000))
        where = savepoint if savepoint else self.storage.layout.checkpoint(data.checkpoint_id)
        kind = "savepoint" if savepoint else "checkpoint"
        self.announce(f"resuming from {kind} {data.checkpoint_id} (epoch {self.position.epoch}, taken {taken}) "
                      f"in {where}")

    def _check_step_identity(self, by_step: dict[str, dict], what: str) -> None:
        """A step's name is its state's identity: state in the checkpoint under a name the
        graph no longer has is a renamed or removed step. Stop before anything runs,
        unless the user chose to drop that state."""
        unclaimed = sorted(set(by_step) - set(self.lineages_of))
        if not unclaimed:
            return
        names = ", ".join(repr(n) for n in unclaimed)
        if self.settings.ignore_unclaimed_state:
            log.warning("job %s: %s holds the state of step(s) %s, which the pipeline no longer has; that state is "
                        "dropped (execution.savepoint.ignore-unclaimed-state=true)", self.job_name, what, names)
            return
        raise _refusal(ConfigError(
            f"{what} holds the state of step {names}, which the pipeline no longer has (a step's name is its "
            f"state's identity): give the step its old name back, or drop its state with "
            f"--allow-non-restored-state (execution.savepoint.ignore-unclaimed-state=true)"),
            RestoreRefusal.UNCLAIMED_STATE)

    def first_epoch_done(self) -> None:
        """The first epoch after a restore is done: every subtask holds its state (and a
        step that started empty, its initial state)."""
        self.fresh_steps = set()
        if self.restoring:
            self.restoring = False
            self.gateway.set_restoring([])

    def before_first_epoch(self) -> None:
        if self.restoring:
            for participant in self._step_participants():
                self.faults.before_restore(participant)  # rehearsal: a slow restore

    def mark_bad(self, checkpoint_id: int, e: BaseException) -> None:
        self.bad_checkpoints[checkpoint_id] = f"chk-{checkpoint_id}: {_summary(e)}"
        log.error("ALARM checkpoint %s of job %s is corrupt and is skipped; falling back to an older retained "
                  "checkpoint. %s", checkpoint_id, self.job_name, _summary(e))

    def note_failure(self, e: BaseException, completed: Sequence[CompletedCheckpointData]) -> None:
        """An epoch (or a restore) failed with `e`: a checkpoint whose files the executors
        could not rebuild state from is never restored again (`corrupt_restored_checkpoint`)."""
        restored = next((c for c in completed if c.checkpoint_id == self.restored_from), None)
        if corrupt_restored_checkpoint(e, restored):
            self.mark_bad(restored.checkpoint_id, e)
