"""The barrier and commit steps of an epoch (runtime/snapshots.py) with the real
coordinator and gateway, in memory, no Spark: checkpoints triggered between two epoch
boundaries share one snapshot (the older ones are subsumed, never counted), one
triggered while an epoch ran completes at its end, every participant's part is the
job's position as of that epoch, and only a completed checkpoint publishes."""

from __future__ import annotations

from types import SimpleNamespace

from sparkpoint.checkpoint import CheckpointCoordinator, CheckpointCoordinatorConfig, ManualScheduler
from sparkpoint.connectors.base import SlicePlan
from sparkpoint.faults import ParticipantFaults
from sparkpoint.runtime.epoch_replay import EpochReplay
from sparkpoint.runtime.gateway import RuntimeGateway
from sparkpoint.runtime.graph import EventTimes
from sparkpoint.runtime.participants import all_participants
from sparkpoint.runtime.position import JobPosition
from sparkpoint.runtime.snapshots import Committer, Snapshotter
from tests.memory import InMemoryCheckpointStorage, InMemoryIdCounter


class StagingSink:
    name = "out"

    def __init__(self) -> None:
        self.staged: list[int] = []
        self.published: list[list[int]] = []

    def pre_commit(self, checkpoint_id: int) -> dict:
        return {"epochs": list(self.staged)}

    def commit(self, handle: dict) -> None:
        self.published.append(handle["epochs"])


class Source:
    def __init__(self) -> None:
        self.committed: list[tuple[int, dict]] = []

    def notify_checkpoint_complete(self, checkpoint_id: int, positions: dict) -> None:
        self.committed.append((checkpoint_id, positions))


def _job():
    source, sink = Source(), StagingSink()
    position = JobPosition(["events"], EventTimes(SimpleNamespace(watermark_keys={}, step_watermarks={},
                                                                  step_upstreams={})))
    position.start_fresh(lambda name: {"events:0": 0})
    committer: list[Committer] = []
    gateway = RuntimeGateway(all_participants(["events"], ["out"], [], 1),
                             on_complete=lambda cid, data: committer[0].on_complete(cid, data))
    coordinator = CheckpointCoordinator("orders", CheckpointCoordinatorConfig(interval_ms=1000, max_concurrent=5),
                                        ManualScheduler(), InMemoryIdCounter(), InMemoryCheckpointStorage(), gateway)
    plans = EpochReplay(None)
    storage = SimpleNamespace(lease=SimpleNamespace(check=lambda: None))
    committer.append(Committer("orders", storage, coordinator, gateway, {"events": source}, {"out": sink}, {}, plans))
    snapshotter = Snapshotter(coordinator, gateway, ParticipantFaults.from_rules([]), position, plans,
                              {"out": sink}, {}, {})
    return SimpleNamespace(source=source, sink=sink, position=position, gateway=gateway, coordinator=coordinator,
                           snapshotter=snapshotter)


def _epoch(job, end: int) -> None:
    """Steps 3 to 5 of an epoch: the sink stages it, the position advances."""
    epoch = job.position.next_epoch
    job.sink.staged.append(epoch)
    job.position.advance(epoch, {"events": SlicePlan(dict(job.position.source_positions["events"]),
                                                     {"events:0": end})}, 10, {}, 0, {}, final=False)


def test_checkpoints_between_two_boundaries_share_the_next_epochs_snapshot_and_the_older_are_subsumed():
    job = _job()
    first, second, third = (job.coordinator.trigger_checkpoint() for _ in range(3))
    barriers = job.snapshotter.take_barriers()
    assert barriers.checkpoint_id == 3 and barriers.savepoint is None
    _epoch(job, 10)
    job.snapshotter.ack_barriers(barriers, result=None)
    job.gateway.drain_commits()

    assert third.result(0).handles["job"]["epoch"] == 0
    assert third.result(0).handles["source:events"] == {"positions": {"events:0": 10}}
    assert first.exception(0) is not None and second.exception(0) is not None
    stats = job.coordinator.stats.snapshot()
    assert stats["counted_failed"] == 0, "a subsumed checkpoint is no failure"
    assert job.sink.published == [[0]] and job.source.committed == [(3, {"events:0": 10})]
    job.coordinator.shutdown()
    job.gateway.shutdown()


def test_a_checkpoint_triggered_while_an_epoch_ran_completes_at_its_end_and_nothing_publishes_before():
    job = _job()
    barriers = job.snapshotter.take_barriers()
    assert barriers.checkpoint_id is None
    _epoch(job, 10)
    checkpoint = job.coordinator.trigger_checkpoint()  # while the epoch ran
    assert job.sink.published == [], "staged output is published only by a completed checkpoint"
    job.snapshotter.ack_barriers(barriers, result=SimpleNamespace(with_sync_errors=lambda errors: None))
    job.gateway.drain_commits()
    assert checkpoint.result(0).handles["job"]["epoch"] == 0
    assert job.sink.published == [[0]]
    job.coordinator.shutdown()
    job.gateway.shutdown()
