"""A storage rule with `duration` is an outage of that length: every matching call
fails from the first one until `duration` seconds later (manual clock), then storage
answers again. `sparkpoint chaos` uses it for a storage outage during restore."""

from __future__ import annotations

import pytest

from sparkpoint.errors import ConfigError, StorageError
from sparkpoint.faults import FaultyStorageFS, parse_fault_rules
from sparkpoint.storage.checkpoint_storage import FsCheckpointStorage


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_duration_rule_fails_every_matching_read_for_that_long_from_its_first_firing(
        storage: FsCheckpointStorage) -> None:
    layout = storage.layout
    storage.fs.makedirs(layout.checkpoint(3))
    storage.fs.write_atomic(layout.metadata(3), b"meta")
    clock = Clock()
    faulty = FaultyStorageFS(storage.fs, [{"op": "read", "path": "*/chk-*/_metadata", "action": "fail",
                                           "duration": 3}], clock=clock)
    clock.now += 60  # the outage starts with the first matching call, not with the rule
    for _ in range(3):
        with pytest.raises(StorageError, match="injected fault: read of .*chk-3/_metadata"):
            faulty.read_bytes(layout.metadata(3))
        clock.now += 0.9
    clock.now += 0.4  # 3.1 s after the first failure: storage is back, for good
    assert faulty.read_bytes(layout.metadata(3)) == b"meta"
    clock.now += 100
    assert faulty.read_bytes(layout.metadata(3)) == b"meta"
    assert len(faulty.fired) == 3


def test_duration_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="duration=0 must be a positive number of seconds"):
        parse_fault_rules([{"op": "read", "action": "fail", "duration": 0}])
    assert parse_fault_rules([{"op": "read", "action": "fail", "duration": "2.5"}])[0].duration == 2.5


def test_with_a_window_file_every_process_sees_one_outage_from_the_first_firing_anywhere(
        storage: FsCheckpointStorage, tmp_path) -> None:
    """Spark's Python workers come and go (a failover may restore on fresh ones): with
    per-process windows each new worker would start the outage again, and it would
    never end for the job. Two FaultyStorageFS stand for two processes."""
    layout = storage.layout
    storage.fs.makedirs(layout.join("shared"))
    storage.fs.write_atomic(layout.join("shared/state.log"), b"state")
    wall = Clock()
    rule = {"op": "read", "path": "*/shared/**", "action": "fail", "duration": 3,
            "window_file": str(tmp_path / "outage")}
    first = FaultyStorageFS(storage.fs, [dict(rule)], wall_clock=wall)
    with pytest.raises(StorageError):
        first.read_bytes(layout.join("shared/state.log"))
    wall.now += 2
    later = FaultyStorageFS(storage.fs, [dict(rule)], wall_clock=wall)  # a worker started during the outage
    with pytest.raises(StorageError):
        later.read_bytes(layout.join("shared/state.log"))
    wall.now += 1.5
    fresh = FaultyStorageFS(storage.fs, [dict(rule)], wall_clock=wall)  # one started after it
    assert fresh.read_bytes(layout.join("shared/state.log")) == b"state"
    assert later.read_bytes(layout.join("shared/state.log")) == b"state"
    with pytest.raises(ConfigError, match="window_file needs a duration"):
        parse_fault_rules([{"op": "read", "action": "fail", "window_file": str(tmp_path / "x")}])
