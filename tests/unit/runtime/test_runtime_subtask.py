"""The worker's per-epoch step (runtime.subtask.EpochTask) on real RocksDB stores:
stale or missing state is refused, a re-run returns the committed rows, and a
failing synchronous snapshot part is reported, never raised."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from sparkpoint.api import KeyedAggregate
from sparkpoint.errors import StaleStateError
from sparkpoint.runtime.stage import split_meta
from sparkpoint.runtime.subtask import EpochTask, local_checkpoint_dir
from sparkpoint.state.interfaces import KEY_GROUP_COL, MARKER_COL, SUBTASK_COL

MAXP = 4


def op() -> KeyedAggregate:
    return KeyedAggregate("totals", ["user"], "amount", aggs=("count", "sum"), value_type="bigint",
                          key_schema="user STRING")


def worker_input(users: list[str], amounts: list[int]) -> pa.Table:
    """Pre-aggregated rows of subtask 0 (parallelism 1) plus its marker row."""
    n = len(users)
    rows = pa.table({"user": users + [None], "__count": [1] * n + [None], "__nvalues": [1] * n + [None],
                     "__sum": amounts + [None], "__min": amounts + [None], "__max": amounts + [None],
                     KEY_GROUP_COL: pa.array([0] * n + [None], pa.int32()),
                     SUBTASK_COL: pa.array([0] * (n + 1), pa.int32()),
                     MARKER_COL: [False] * n + [True]})
    return rows


def task(root, epoch: int, checkpoint_id: int | None = None, fail_sync: tuple[int, ...] = ()) -> EpochTask:
    return EpochTask(op(), str(root), epoch, 1, MAXP, None, 0, False, checkpoint_id, fail_sync)


def totals(out: pa.Table) -> list[tuple]:
    data, _ = split_meta(out, op().output_schema)
    return sorted((r["user"], r["count"], r["sum"]) for r in data.to_pylist())


def test_epochs_apply_once_and_a_rerun_returns_the_committed_rows(tmp_path):
    assert totals(task(tmp_path, 0)(worker_input(["ann", "bob"], [1, 2]))) == [("ann", 1, 1), ("bob", 1, 2)]
    first = totals(task(tmp_path, 1)(worker_input(["ann"], [10])))
    assert first == [("ann", 2, 11)]
    # Spark recomputes epoch 1 (retry, or a second action): same rows, state not applied twice.
    assert totals(task(tmp_path, 1)(worker_input(["ann"], [10]))) == first
    assert totals(task(tmp_path, 2)(worker_input(["ann"], [1]))) == [("ann", 3, 12)]


def test_missing_local_state_is_refused_not_silently_recreated(tmp_path):
    with pytest.raises(StaleStateError, match="missing"):
        task(tmp_path, 5)(worker_input(["ann"], [1]))


def test_state_at_the_wrong_epoch_is_refused(tmp_path):
    task(tmp_path, 0)(worker_input(["ann"], [1]))
    with pytest.raises(StaleStateError, match="at epoch 0, expected 2"):
        task(tmp_path, 3)(worker_input(["ann"], [1]))


def test_a_barrier_takes_a_local_checkpoint_and_a_failing_sync_part_is_reported_not_raised(tmp_path):
    out = task(tmp_path, 0, checkpoint_id=7)(worker_input(["ann"], [1]))
    _, meta = split_meta(out, op().output_schema)
    assert meta[0]["__meta_error"] is None
    assert os.path.isdir(local_checkpoint_dir(str(tmp_path), "totals", 0, 7))

    out = task(tmp_path, 1, checkpoint_id=8, fail_sync=(0,))(worker_input(["ann"], [2]))
    data, meta = split_meta(out, op().output_schema)
    assert "injected fault" in meta[0]["__meta_error"]       # the driver declines checkpoint 8 with it
    assert totals(out) == [("ann", 2, 3)]                    # ...and the epoch's work still counts
    assert not os.path.exists(local_checkpoint_dir(str(tmp_path), "totals", 0, 8))
