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
