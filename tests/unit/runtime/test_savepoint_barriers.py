"""Savepoint barriers in the epoch loop: several barriers between two epoch boundaries
share one snapshot, but an epoch copies state files to one savepoint target only, and a
savepoint is never subsumed. The oldest savepoint rides with this epoch; later ones wait
in the gateway for the next epochs, and every one of them completes."""

from __future__ import annotations

from sparkpoint.checkpoint import CheckpointCoordinator, CheckpointCoordinatorConfig, ManualScheduler
from sparkpoint.runtime.gateway import RuntimeGateway
from sparkpoint.runtime.savepoints import one_savepoint_at_a_time
from tests.memory import InMemoryCheckpointStorage, InMemoryIdCounter, InMemoryLocation


class _WithSavepoints(InMemoryCheckpointStorage):
    def initialize_savepoint_location(self, checkpoint_id: int, target: str | None) -> InMemoryLocation:
        return InMemoryLocation(checkpoint_id, target or "mem://job/savepoints")


def test_two_savepoints_between_epoch_boundaries_both_complete():
    gateway = RuntimeGateway(["job"], on_complete=lambda checkpoint_id, data: None)
    coordinator = CheckpointCoordinator("orders", CheckpointCoordinatorConfig(interval_ms=1000, max_concurrent=5),
                                        ManualScheduler(), InMemoryIdCounter(), _WithSavepoints(), gateway)
    first = coordinator.trigger_savepoint("mem://a")
    second = coordinator.trigger_savepoint("mem://b")
    checkpoint = coordinator.trigger_checkpoint()

    epoch = gateway.take_barriers(one_savepoint_at_a_time())
    assert [(b.checkpoint_id, b.properties.savepoint) for b in epoch] == [(1, True), (3, False)]
    for barrier in epoch:
        coordinator.acknowledge(barrier.checkpoint_id, "job", {"epoch": 0})
    assert first.result(0).checkpoint_id == 1 and checkpoint.result(0).checkpoint_id == 3
    assert not second.done()

    next_epoch = gateway.take_barriers(one_savepoint_at_a_time())
    assert [b.checkpoint_id for b in next_epoch] == [2]
    coordinator.acknowledge(2, "job", {"epoch": 1})
    assert second.result(0).properties.target == "mem://b"
    assert not gateway.has_barrier()
    coordinator.shutdown()


def test_an_intermediate_savepoint_runs_no_commit_in_the_runtime_and_leaves_nothing_in_flight():
    """Only checkpoints and a stop's savepoint reach the committer (sinks publish, sources
    commit offsets); a completed intermediate savepoint's in-flight snapshot record is
    still let go of."""
    committed: list[int] = []
    gateway = RuntimeGateway(["job"], on_complete=lambda checkpoint_id, data: committed.append(checkpoint_id))
    coordinator = CheckpointCoordinator("orders", CheckpointCoordinatorConfig(interval_ms=1000, max_concurrent=5),
                                        ManualScheduler(), InMemoryIdCounter(), _WithSavepoints(), gateway)
    savepoint = coordinator.trigger_savepoint("mem://a")
    gateway.take_barriers()
    coordinator.acknowledge(1, "job", {"epoch": 0})
    assert savepoint.result(0).checkpoint_id == 1
    gateway.drain_commits()
    assert committed == []
    assert gateway.cancel_event(1) is None

    checkpoint = coordinator.trigger_checkpoint()
    gateway.take_barriers()
    coordinator.acknowledge(2, "job", {"epoch": 1})
    assert checkpoint.result(0).checkpoint_id == 2
    final = coordinator.trigger_savepoint("mem://b", terminate=True)
    gateway.take_barriers()
    coordinator.acknowledge(3, "job", {"epoch": 2})
    assert final.result(0).properties.terminate
    gateway.drain_commits()
    assert committed == [2, 3]
    coordinator.shutdown()
    gateway.shutdown()
