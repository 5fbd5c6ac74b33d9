"""Durable checkpoint ids (seed 002): never reused after a restart, never backward."""

from __future__ import annotations

import pytest

from sparkpoint.errors import StorageError
from sparkpoint.faults import FaultyStorageFS
from sparkpoint.storage.checkpoint_storage import FsCheckpointStorage
from sparkpoint.storage.ids import DurableCheckpointIDCounter


def restarted(storage: FsCheckpointStorage) -> DurableCheckpointIDCounter:
    counter = DurableCheckpointIDCounter(storage.fs, storage.layout)
    counter.start()
    return counter


def test_ids_continue_across_restarts(storage: FsCheckpointStorage) -> None:
    counter = restarted(storage)
    assert [counter.get_and_increment() for _ in range(3)] == [1, 2, 3]
    assert restarted(storage).get_and_increment() == 4


def test_ids_continue_past_directories_with_and_without_metadata(storage: FsCheckpointStorage) -> None:
    restarted(storage).get_and_increment()  # _ids says 1
    storage.initialize_location(7)  # a crashed run's leftover, no _metadata
    storage.fs.write_atomic(storage.layout.metadata(5), b"{}")
    assert restarted(storage).get_and_increment() == 8


def test_damaged_ids_file_falls_back_to_the_directories(storage: FsCheckpointStorage) -> None:
    storage.initialize_location(3)
    storage.fs.write_atomic(storage.layout.ids, b"\x00garbage")
    assert restarted(storage).get() == 4


def test_set_count_never_moves_backward(storage: FsCheckpointStorage) -> None:
    counter = restarted(storage)
    counter.set_count(10)
    counter.set_count(2)
    assert counter.get_and_increment() == 10
    assert restarted(storage).get() == 11


def test_id_is_not_handed_out_if_it_cannot_be_persisted(storage: FsCheckpointStorage) -> None:
    faulty = FaultyStorageFS(storage.fs, [{"op": "write", "path": "*/_ids", "action": "fail", "times": 1}])
    counter = DurableCheckpointIDCounter(faulty, storage.layout)
    counter.start()
    with pytest.raises(StorageError, match="injected fault"):
        counter.get_and_increment()
    assert counter.get_and_increment() == 1
