"""Epochs a sink published past the restored checkpoint are replayed from the epoch plan
log as first planned, all of them or none: a missing, damaged or foreign entry is one
PublishedEpochsNotReplayableError before anything runs (or, when the user accepts it, a
warning and epochs planned anew). A plan that storage refused is retried before the sink
may publish it."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkpoint.connectors.base import SlicePlan
from sparkpoint.errors import PublishedEpochsNotReplayableError, StorageError
from sparkpoint.runtime.epoch_replay import EpochReplay
from sparkpoint.storage.epoch_plans import EpochPlanLog
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout


class FlakyFS(StorageFS):
    """Local storage whose writes fail while `down`."""

    down = False

    def write_atomic(self, path: str, data: bytes) -> None:
        if self.down:
            raise StorageError(f"checkpoint storage write failed for {path}: injected outage")
        super().write_atomic(path, data)


@pytest.fixture
def plan_log(tmp_path: Path) -> EpochPlanLog:
    fs = FlakyFS.from_url(str(tmp_path))
    return EpochPlanLog(fs, JobLayout(f"{fs.root}/job"))


def run_epochs(replay: EpochReplay, epochs: range, per_epoch: int = 10) -> None:
    """What the epoch loop records: epoch e reads [10e, 10e+10) of one split."""
    for e in epochs:
        replay.record(e, SlicePlan({"t:0": per_epoch * e}, {"t:0": per_epoch * e + per_epoch}), final=False,
                      watermark=1000 + e, processing_time_ms=5000 + e)


def test_published_epochs_after_the_restored_one_replay_as_first_planned(plan_log: EpochPlanLog) -> None:
    first = EpochReplay(plan_log)
    first.begin(None)
    run_epochs(first, range(0, 6))

    after = EpochReplay(plan_log)  # the next run, restoring the checkpoint at epoch 2
    after.begin(first.history)
    after.prepare(2, 4, {"t:0": 30}, "checkpoint 7", "kafka topic out", publish_again=False)

    assert [after.replay(e) for e in (0, 1, 2, 5)] == [None, None, None, None]  # 5: not published, planned anew
    three, four = after.replay(3), after.replay(4)
    assert (three.start, three.end, three.watermark, three.processing_time_ms, three.final) == \
        ({"t:0": 30}, {"t:0": 40}, 1003, 5003, False)
    assert (four.start, four.end) == ({"t:0": 40}, {"t:0": 50})


def test_nothing_to_replay_when_the_sink_published_nothing_past_the_restored_epoch(plan_log) -> None:
    replay = EpochReplay(plan_log)
    replay.begin("h")
    replay.prepare(4, 4, {}, "checkpoint 7", "kafka topic out", publish_again=False)
    replay.prepare(4, None, {}, "checkpoint 7", "kafka topic out", publish_again=False)
    assert replay.replay(5) is None


@pytest.mark.parametrize("damage", ["missing", "damaged", "another history", "another start"])
def test_an_entry_that_cannot_be_replayed_stops_the_restore_with_one_line(plan_log: EpochPlanLog,
                                                                         damage: str) -> None:
    first = EpochReplay(plan_log)
    first.begin(None)
    run_epochs(first, range(0, 6))
    history, positions = first.history, {"t:0": 30}
    if damage == "missing":
        plan_log.fs.rm(plan_log.path(4))
    elif damage == "damaged":
        plan_log.fs.write_atomic(plan_log.path(4), plan_log.fs.read_bytes(plan_log.path(4))[:-9])
    elif damage == "another history":  # a fresh start since wrote epoch 3 and 4
        fresh = EpochReplay(plan_log)
        fresh.begin(None)
        run_epochs(fresh, range(3, 5))
    else:
        positions = {"t:0": 25}

    after = EpochReplay(plan_log)
    after.begin(history)
    with pytest.raises(PublishedEpochsNotReplayableError) as e:
        after.prepare(2, 4, positions, "checkpoint 7", "kafka topic out", publish_again=False)

    text = str(e.value)
    assert "kafka topic out already published epochs 3..4, after checkpoint 7 (epoch 2)" in text
    assert "--set restore.unreplayable-epochs=publish-again" in text
    assert "\n" not in text
    assert after.replay(3) is None  # none of them, not some


def test_publish_again_plans_the_epochs_anew_with_a_warning(plan_log: EpochPlanLog, caplog) -> None:
    replay = EpochReplay(plan_log)
    replay.begin("h")
    with caplog.at_level(logging.WARNING):
        replay.prepare(2, 4, {"t:0": 30}, "checkpoint 7", "kafka topic out", publish_again=True)
    assert replay.replay(3) is None
    assert "planned anew and published a second time" in caplog.text


def test_a_plan_storage_refused_is_written_before_the_sink_may_publish_it(plan_log: EpochPlanLog) -> None:
    replay = EpochReplay(plan_log)
    replay.begin(None)
    run_epochs(replay, range(0, 2))
    plan_log.fs.down = True
    run_epochs(replay, range(2, 4))  # the epochs run on; their plans wait
    why = replay.flush()
    assert why is not None and "the plan of epoch 2 is not in the epoch plan log yet" in why
    assert plan_log.epochs() == [0, 1]

    plan_log.fs.down = False
    assert replay.flush() is None
    assert plan_log.epochs() == [0, 1, 2, 3]
    assert plan_log.read(3).start == {"t:0": 30}


def test_entries_no_retained_checkpoint_needs_are_deleted(plan_log: EpochPlanLog) -> None:
    replay = EpochReplay(plan_log)
    replay.begin(None)
    run_epochs(replay, range(0, 6))
    replay.forget_through(3)
    assert plan_log.epochs() == [4, 5]


def test_without_a_log_nothing_is_written_or_replayed(plan_log: EpochPlanLog) -> None:
    replay = EpochReplay(None)
    run_epochs(replay, range(0, 3))
    assert replay.flush() is None
    assert plan_log.epochs() == []


class RecordingCoordinator:
    def __init__(self) -> None:
        self.acks: dict[str, object] = {}
        self.declines: dict[str, tuple[object, object]] = {}

    def acknowledge(self, checkpoint_id: int, participant: str, handle: object, metrics: object = None) -> None:
        self.acks[participant] = handle

    def decline(self, checkpoint_id: int, participant: str, reason: object, error: object) -> None:
        self.declines[participant] = (reason, error)


class CountingSink:
    name = "kafka"

    def __init__(self) -> None:
        self.pre_commits: list[int] = []

    def pre_commit(self, checkpoint_id: int) -> dict:
        self.pre_commits.append(checkpoint_id)
        return {"checkpoint_id": checkpoint_id}


def test_the_sink_part_of_a_checkpoint_is_declined_while_an_epoch_it_would_publish_has_no_plan(
        plan_log: EpochPlanLog) -> None:
    from sparkpoint.checkpoint import CheckpointFailureReason
    from sparkpoint.faults import ParticipantFaults
    from sparkpoint.runtime.graph import EventTimes
    from sparkpoint.runtime.position import JobPosition
    from sparkpoint.runtime.snapshots import Snapshotter

    no_event_time = SimpleNamespace(watermark_keys={}, step_watermarks={}, step_upstreams={})
    position = JobPosition(["events"], EventTimes(no_event_time))
    coordinator, sink, epoch_plans = RecordingCoordinator(), CountingSink(), EpochReplay(plan_log)
    snapshotter = Snapshotter(coordinator, None, ParticipantFaults.from_rules([]), position, epoch_plans,
                              {"kafka": sink}, {}, {})
    epoch_plans.begin(None)
    plan_log.fs.down = True
    run_epochs(epoch_plans, range(0, 4))

    snapshotter.ack(7, None)

    reason, error = coordinator.declines["sink:kafka"]
    assert reason == CheckpointFailureReason.TASK_SYNC_FAILURE
    assert "the plan of epoch 0 is not in the epoch plan log yet" in str(error)
    assert sink.pre_commits == []  # its epochs stay staged for a later checkpoint
    assert coordinator.acks["job"]["history"] == epoch_plans.history

    plan_log.fs.down = False
    snapshotter.coordinator = coordinator = RecordingCoordinator()
    snapshotter.ack(8, None)
    assert sink.pre_commits == [8] and "sink:kafka" not in coordinator.declines
    assert plan_log.epochs() == [0, 1, 2, 3]
