"""What a completed savepoint commits (Flink's rule since 1.15): an intermediate savepoint,
taken while the job keeps running, commits nothing: no `notify_complete`, so sinks do
not publish and sources do not commit offsets. A failover restores the job's latest
checkpoint, not the savepoint, and replays the epochs after that checkpoint: output a
savepoint had committed would be published twice. A stop-with-savepoint ends the job,
so it commits. What was staged before an intermediate savepoint is committed by the
next completed checkpoint, whose handle is cumulative."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from checkpoint_fakes import SavepointStorage
from checkpoint_support import make_harness

from sparkpoint.checkpoint import CompletedCheckpointData
from tests.memory import RecordingGateway

SINK = "sink:out"


def _harness(**kwargs):
    return make_harness(storage=SavepointStorage(), **kwargs)


def test_an_intermediate_savepoint_does_not_notify_participants_to_commit(caplog):
    h = _harness()
    with caplog.at_level(logging.INFO, logger="sparkpoint.checkpoint.coordinator"):
        savepoint = h.coordinator.trigger_savepoint("mem://elsewhere/sp")
        h.ack_all(1)
    data = savepoint.result(0)
    assert data.properties.savepoint and not data.properties.terminate
    assert h.gateway.notified == []
    assert "savepoint 1 complete; its output is committed by the next checkpoint" in caplog.text


def test_a_stop_with_savepoint_notifies_participants_to_commit():
    h = _harness()
    h.coordinator.start_scheduler()
    h.coordinator.stop_scheduler()
    stop = h.coordinator.trigger_savepoint(terminate=True)
    h.ack_all(1)
    assert stop.result(0).properties.terminate
    assert h.gateway.notified == [1]


def test_the_checkpoint_after_an_intermediate_savepoint_is_notified():
    h = _harness()
    savepoint = h.coordinator.trigger_savepoint()
    h.ack_all(1)
    savepoint.result(0)
    checkpoint = h.trigger(forced=True)
    h.ack_all(2)
    assert checkpoint.result(0).checkpoint_id == 2
    assert h.gateway.notified == [2]


# -- the same with a sink that cannot withdraw what it published (Kafka's kind) --------
@dataclass
class PublishOnceSink:
    """Stages rows; a handle lists every row staged since the last commit (cumulative);
    `commit` publishes them for good; `recover` re-runs the restored handle's commit and
    drops the rest (they are produced again by the replay)."""

    staged: list[str] = field(default_factory=list)
    published: list[str] = field(default_factory=list)
    committed_up_to: int = 0  # the newest checkpoint id published, as Kafka's marker

    def pre_commit(self, checkpoint_id: int) -> dict[str, Any]:
        return {"checkpoint_id": checkpoint_id, "rows": list(self.staged)}

    def commit(self, handle: dict[str, Any]) -> None:
        if handle["checkpoint_id"] <= self.committed_up_to:
            return
        self.published.extend(handle["rows"])
        self.committed_up_to = handle["checkpoint_id"]
        self.staged = [r for r in self.staged if r not in handle["rows"]]

    def recover(self, handle: dict[str, Any] | None) -> None:
        if handle is not None:
            self.commit(handle)
        self.staged = []


@dataclass
class SinkGateway(RecordingGateway):
    sink: PublishOnceSink = field(default_factory=PublishOnceSink)

    def notify_complete(self, checkpoint_id: int, data: CompletedCheckpointData) -> None:
        super().notify_complete(checkpoint_id, data)
        self.sink.commit(data.handles[SINK])


def test_a_failover_after_an_intermediate_savepoint_publishes_each_row_once():
    """chk-1 covers epoch a; the savepoint (id 2) covers b; the job fails over before its
    next checkpoint, restores chk-1 and replays b; chk-3 commits. Each row once."""
    gateway = SinkGateway(participant_ids=["job", SINK])
    h = make_harness(storage=SavepointStorage(), gateway=gateway)
    sink = gateway.sink

    def barrier(future) -> CompletedCheckpointData:
        cid = gateway.triggered_ids[-1]
        h.coordinator.acknowledge(cid, "job", {"epoch": cid})
        h.coordinator.acknowledge(cid, SINK, sink.pre_commit(cid))
        return future.result(0)

    sink.staged.append("a")
    barrier(h.trigger(forced=True))
    sink.staged.append("b")
    barrier(h.coordinator.trigger_savepoint())
    assert sink.published == ["a"], "the savepoint published its output"

    # Failover: the latest checkpoint is chk-1 (a savepoint is never restored from).
    h.coordinator.suspend_and_settle(5)
    restored = h.coordinator.restore_latest()
    assert restored.checkpoint_id == 1
    sink.recover(dict(restored.handles[SINK]))
    h.coordinator.resume()
    sink.staged.append("b")  # the replay of the epoch after chk-1
    barrier(h.trigger(forced=True))
    assert sink.published == ["a", "b"]
