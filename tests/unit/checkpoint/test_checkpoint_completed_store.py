from __future__ import annotations

import pytest

from sparkpoint.checkpoint import CheckpointProperties, CompletedCheckpointData, CompletedCheckpointStore


def cp(checkpoint_id: int) -> CompletedCheckpointData:
    return CompletedCheckpointData("orders", checkpoint_id, 0, 1, {"p": {"id": checkpoint_id}})


def test_add_returns_what_falls_out_of_retention_oldest_first():
    store = CompletedCheckpointStore(num_retained=2)
    assert store.add(cp(1)) == [] and store.add(cp(2)) == []
    assert store.add(cp(3)) == [cp(1)]
    assert store.latest() == cp(3)
    assert store.all() == [cp(2), cp(3)]
    assert store.retained_handles() == [{"id": 2}, {"id": 3}]


def test_ids_only_go_up():
    store = CompletedCheckpointStore(num_retained=3)
    store.add(cp(5))
    with pytest.raises(ValueError, match="not newer"):
        store.add(cp(5))


def test_recover_keeps_everything_sorted_until_the_next_add():
    store = CompletedCheckpointStore(num_retained=1)
    store.recover([cp(4), cp(2), cp(3)])
    assert store.all() == [cp(2), cp(3), cp(4)]
    assert store.add(cp(5)) == [cp(2), cp(3), cp(4)]
    assert store.all() == [cp(5)]


def test_empty_store():
    store = CompletedCheckpointStore(num_retained=1)
    assert store.latest() is None and store.all() == [] and len(store) == 0


def _savepoint(checkpoint_id: int) -> CompletedCheckpointData:
    return CompletedCheckpointData("orders", checkpoint_id, 0, 1, {"p": {"id": checkpoint_id}},
                                   CheckpointProperties(forced=True, periodic=False, savepoint=True))


def test_a_savepoint_never_enters_the_store_and_pushes_nothing_out():
    store = CompletedCheckpointStore(num_retained=1)
    store.add(cp(1))
    with pytest.raises(ValueError, match="savepoint 2 cannot enter"):
        store.add(_savepoint(2))
    assert store.all() == [cp(1)]
    store.recover([cp(1), _savepoint(2)])
    assert store.all() == [cp(1)]
