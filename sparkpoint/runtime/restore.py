"""Restoring a job: which checkpoint, rewinding sources, recovering the sink, and
handing each subtask's lineage to the executors (part of JobMaster).

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

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.errors import ConfigError, CorruptCheckpointError, NoValidCheckpointError
from sparkpoint.runtime.failures import JOB
from sparkpoint.runtime.failures import summarize as _summary
from sparkpoint.storage.handles import checkpoint_file_entries

log = logging.getLogger("sparkpoint.runtime.jobmaster")


class RestoreSteps:
    """JobMaster's restore steps; they use the job's attributes (source, sink, operator,
    lineages, storage, coordinator, gateway, settings)."""

    def _restore(self) -> None:
        """Pick the latest completed checkpoint not known to be corrupt, rewind sources,
        recover the sink and take its lineages.

        First every checkpoint in flight settles: pending ones are aborted, and one whose
        `_metadata` is being written finishes (and is committed) or is aborted before it,
        so the restore below sees the true latest checkpoint and no commit of a newer one
        can land after the sink recovered to an older one (issue 9.4)."""
        self.coordinator.suspend_and_settle(self.settings.checkpoint_timeout_ms / 1000)
        self.gateway.abort_all_local()
        self.gateway.wait_idle()
        self.gateway.drain_commits()
        self._failover_reason = None
        self.final_done = False
        self.coordinator.restore_latest()
        completed = list(reversed(self.coordinator.completed_store.all()))
        if self.settings.restore_mode == "empty":
            self._start_fresh(ignoring=len(completed))
            return
        for data in completed:
            if data.checkpoint_id in self._bad_checkpoints:
                continue
            try:
                self._restore_from(data)
                return
            except CorruptCheckpointError as e:
                self._mark_bad(data.checkpoint_id, e)
        if completed:
            raise NoValidCheckpointError(
                f"job {self.job_name} has {len(completed)} completed checkpoint(s) in {self.storage.layout.root} but none "
                f"restores: {'; '.join(self._bad_checkpoints.values())}. Nothing was started, so nothing was "
                f"lost. Inspect them with `sparkpoint doctor {self.settings.checkpoint_dir}`; to start from empty "
                f"state anyway, pass --set restore.mode=empty (sources replay from their start positions)")
        self._start_fresh()

    def _start_fresh(self, ignoring: int = 0) -> None:
        if not self.coordinator.completed_store.all():
            committed = self.sink.committed_epochs()
            if committed and self.settings.restore_mode != "empty":
                raise ConfigError(
                    f"the sink output {self.sink.location} already holds committed output of "
                    f"{len(committed)} epoch(s), but job {self.job_name} has no checkpoint in "
                    f"{self.storage.layout.root}: starting would mix two runs' output. Use an empty output directory, "
                    f"or the checkpoint directory of the run that wrote it")
        self.gateway.set_restoring([])
        if self.lineages is not None:
            self.lineages.reset_empty()
        self.epoch = -1
        self.max_event_time = None
        self.restored_from = None
        self._restoring = False
        self.positions = self.source.initial_positions()
        self.storage.lease.check()  # a fenced run must not touch the sink's staged output
        self.sink.recover(None)
        why = (f"restore.mode=empty: the {ignoring} completed checkpoint(s) in {self.storage.layout.root} are not "
               f"restored, sources replay from their start, and output committed by earlier runs of this job is "
               f"withdrawn from {self.sink.location} so nothing is duplicated" if ignoring else
               "no completed checkpoint in " + self.storage.layout.root)
        log.info("job %s starts from scratch (%s)", self.job_name, why)
        self.progress.announce(f"starting fresh: {why}")

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
            self.lineages.restore({i: handles[self.state_participant(i)] for i in range(self.P)})
            self._rebuild_state(data.checkpoint_id)
            self.gateway.set_restoring([self.state_participant(i) for i in range(self.P)])
            self._restoring = True
        self.epoch = int(job["epoch"])
        self.max_event_time = job.get("max_event_time")
        self.restored_from = data.checkpoint_id
        self.positions = dict(handles[self.source_participant]["positions"])
        self.storage.lease.check()  # a fenced run must not touch the sink's staged output
        self.sink.recover(handles.get(self.sink_participant))
        log.info("job %s restores checkpoint %d (epoch %d)", self.job_name, data.checkpoint_id, self.epoch)
        taken = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(data.completion_timestamp_ms / 1000))
        self.progress.announce(f"resuming from checkpoint {data.checkpoint_id} (epoch {self.epoch}, taken {taken}) "
                               f"in {self.storage.layout.checkpoint(data.checkpoint_id)}")

    def _rebuild_state(self, checkpoint_id: int) -> None:
        """Every subtask rebuilds the restored state on an executor from verified files,
        BEFORE the sink recovers: a checkpoint whose files are damaged is skipped while
        nothing has been touched yet (the sink's recovery may withdraw later output)."""
        from sparkpoint.runtime.executor.subtask import RestoreTask
        from sparkpoint.runtime.stage import restore_state

        task = RestoreTask(self.local_root, self.storage_ref, self.lineages.for_tasks())
        try:
            reports = restore_state(self._spark, task, self.P)
        except Exception as e:
            if "CorruptSnapshotError" in str(e) or "CorruptCheckpointError" in str(e):
                raise CorruptCheckpointError(f"checkpoint {checkpoint_id}: {_summary(e)}") from e
            raise
        self.lineages.on_restore(reports)

    def _restored_state_ready(self) -> None:
        """The first epoch after a restore is done: every subtask holds its state."""
        if self._restoring:
            self._restoring = False
            self.gateway.set_restoring([])

    def _before_first_epoch_after_restore(self) -> None:
        if self._restoring and self.operator is not None:
            for i in range(self.P):
                self.faults.before_restore(self.state_participant(i))  # rehearsal: a slow restore

    def _mark_bad(self, checkpoint_id: int, e: BaseException) -> None:
        self._bad_checkpoints[checkpoint_id] = f"chk-{checkpoint_id}: {_summary(e)}"
        log.error("ALARM checkpoint %s of job %s is corrupt and is skipped; falling back to an older retained "
                  "checkpoint. %s", checkpoint_id, self.job_name, _summary(e))

    def _note_corrupt_restore(self, e: BaseException) -> None:
        """An executor could not rebuild state from the restored checkpoint's files
        (missing or failing verification): never restore that checkpoint again."""
        text = str(e)
        cid = self.restored_from
        if cid is None or "CorruptSnapshotError" not in text:
            return
        data = next((c for c in self.coordinator.completed_store.all() if c.checkpoint_id == cid), None)
        if data is None:
            return
        if any(entry.path in text for entry in checkpoint_file_entries(data.handles)):
            self._mark_bad(cid, e)


def _parallelism_of(handles, op_name: str) -> int:
    return sum(1 for k in handles if k.startswith(f"state:{op_name}/"))
