"""A real checkpoint coordinator (in-memory storage, manual clock) wired to a real sink, the
way the runtime wires them: the sink acks every barrier with its `pre_commit` handle, a
completed checkpoint's notification runs `commit(handle)`, and a failover restores the
coordinator's latest checkpoint and runs `recover(handle)` on the same sink. Executors
are played by a pickled copy of the sink's writer (or `write_epoch` for sinks without
one). A savepoint's sink handle goes through `savepoint_handle`, as the runtime passes it,
with the savepoint's directory (a real one if the test names a target)."""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle  # what Spark ships a writer with

from sparkpoint.checkpoint import CheckpointCoordinator, CheckpointCoordinatorConfig, CompletedCheckpointData
from sparkpoint.checkpoint import ManualScheduler
from sparkpoint.connectors.base import Sink
from tests.memory import InMemoryCheckpointStorage, InMemoryIdCounter, RecordingGateway

SINK = "sink:out"


@dataclass(frozen=True)
class SavepointLocation:
    checkpoint_id: int
    target: str

    @property
    def path(self) -> str:
        return self.target


class SavepointCapableStorage(InMemoryCheckpointStorage):
    """Savepoints land in `savepoints` (by target), never among the job's checkpoints."""

    def __init__(self) -> None:
        super().__init__()
        self.savepoints: dict[str, CompletedCheckpointData] = {}

    def initialize_savepoint_location(self, checkpoint_id: int, target: str | None) -> SavepointLocation:
        # fsspec's in-memory filesystem is one per process: a name of its own per savepoint.
        return SavepointLocation(checkpoint_id, target or
                                 f"memory://sinkjob-{uuid.uuid4().hex}/savepoints/savepoint-{checkpoint_id}")

    def commit_metadata(self, location: Any, data: CompletedCheckpointData) -> None:
        if isinstance(location, SavepointLocation):
            self.savepoints[location.target] = data
        else:
            super().commit_metadata(location, data)


@dataclass
class CommittingGateway(RecordingGateway):
    """Commits the sink's handle when told a checkpoint completed, as the runtime's
    committer does (`JobMaster._on_checkpoint_complete`)."""

    sink: Sink | None = None

    def notify_complete(self, checkpoint_id: int, data: CompletedCheckpointData) -> None:
        super().notify_complete(checkpoint_id, data)
        self.sink.commit(data.handles[SINK])


@dataclass
class SinkJob:
    sink: Sink
    storage: SavepointCapableStorage = field(default_factory=SavepointCapableStorage)
    gateway: CommittingGateway = field(init=False)
    coordinator: CheckpointCoordinator = field(init=False)

    def __post_init__(self) -> None:
        self.gateway = CommittingGateway(participant_ids=["job", SINK], sink=self.sink)
        config = CheckpointCoordinatorConfig(interval_ms=1000, min_pause_ms=0, timeout_ms=10_000,
                                             max_concurrent=1, tolerable_failed=3, num_retained=2)
        self.coordinator = CheckpointCoordinator("job", config, ManualScheduler(), InMemoryIdCounter(),
                                                 self.storage, self.gateway, rng=random.Random(7),
                                                 fail_job=lambda reason, error: None)
        self.sink.recover(None)

    def epoch(self, epoch: int, *values: str) -> None:
        """Epoch `epoch` stages `values` (one task)."""
        rows = pa.table({"value": pa.array(list(values), pa.string())})
        writer = self.sink.epoch_writer()
        if writer is None:
            self.sink.write_epoch(epoch, rows)
            return
        shipped = cloudpickle.loads(cloudpickle.dumps(writer))
        handles = shipped.write(epoch, 0, rows)
        json.dumps(handles)  # handles travel as JSON
        self.sink.stage_epoch(epoch, handles)

    def checkpoint(self) -> CompletedCheckpointData:
        return self._barrier(self.coordinator.trigger_checkpoint(forced=True))

    def savepoint(self, *, terminate: bool = False, target: str | None = None) -> CompletedCheckpointData:
        return self._barrier(self.coordinator.trigger_savepoint(target, terminate=terminate))

    def _barrier(self, future) -> CompletedCheckpointData:
        trigger = self.gateway.triggers[-1]
        checkpoint_id = trigger.checkpoint_id
        self.coordinator.acknowledge(checkpoint_id, "job", {"checkpoint": checkpoint_id})
        handle = self.sink.pre_commit(checkpoint_id)
        if trigger.properties.savepoint:  # as the runtime's snapshot step does
            handle = self.sink.savepoint_handle(handle, trigger.location.target, {})
        # Through JSON, as `_metadata` stores it and a restore reads it back.
        self.coordinator.acknowledge(checkpoint_id, SINK, json.loads(json.dumps(handle)))
        return future.result(0)

    def fail_over(self) -> int:
        """Restore the latest checkpoint (never a savepoint) into the same sink; returns
        its id. The caller then replays the epochs after it."""
        self.coordinator.suspend_and_settle(5)
        restored = self.coordinator.restore_latest()
        self.sink.recover(dict(restored.handles[SINK]))
        self.coordinator.resume()
        return restored.checkpoint_id
