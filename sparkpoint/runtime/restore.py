"""Restoring a job: which checkpoint, rewinding sources, recovering the sink, and
the subtasks' state restored in the background (part of JobMaster)."""

from __future__ import annotations

import logging
import os
import shutil

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.errors import ConfigError, CorruptCheckpointError, NoValidCheckpointError
from sparkpoint.runtime.failures import JOB, RestoreFailed
from sparkpoint.runtime.subtask import local_checkpoint_dir, store_dir

log = logging.getLogger("sparkpoint.runtime.jobmaster")


class RestoreSteps:
    """JobMaster's restore steps; they use the job's attributes (source, sink, operator,
    storage, coordinator, gateway, settings)."""

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
                f"job {self.job_name} has {len(completed)} completed checkpoint(s) in {self.storage.layout.root} but none "
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
                    f"{self.storage.layout.root}: starting would mix two runs' output. Use an empty output directory, "
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


def _parallelism_of(handles, op_name: str) -> int:
    return sum(1 for k in handles if k.startswith(f"state:{op_name}/"))
