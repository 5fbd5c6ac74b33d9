"""A subtask's state on executors that do not share a disk (runtime/executor): each
epoch's change log reaches checkpoint storage, any executor rebuilds the exact state
of the epoch it is about to run, a re-run returns the committed rows, a storage
outage only delays durability, and corrupt files are named, never used.

Two "executors" are two local roots; the driver's part is a real `Lineages`."""

from __future__ import annotations

import json
import os
import pyarrow as pa
import pytest

from sparkpoint.api import KeyedAggregate
from sparkpoint.errors import CorruptSnapshotError, StaleStateError
from sparkpoint.runtime.executor.storage import StorageRef
from sparkpoint.runtime.executor.store_opening import EpochInput, slice_identity
from sparkpoint.runtime.executor.subtask import META_INFO, EpochTask
from sparkpoint.runtime.lineages import Lineages
from sparkpoint.runtime.stage import split_meta
from sparkpoint.state.interfaces import KEY_GROUP_COL, MARKER_COL, SUBTASK_COL

MAXP = 4


def op() -> KeyedAggregate:
    return KeyedAggregate("totals", ["user"], "amount", aggs=("count", "sum"), value_type="bigint",
                          key_schema="user STRING")


def worker_input(users: list[str], amounts: list[int]) -> pa.Table:
    """Pre-aggregated rows of subtask 0 (parallelism 1) plus its marker row."""
    n = len(users)
    return pa.table({"user": users + [None], "__count": [1] * n + [None], "__nvalues": [1] * n + [None],
                     "__sum": amounts + [None], "__min": amounts + [None], "__max": amounts + [None],
                     KEY_GROUP_COL: pa.array([0] * n + [None], pa.int32()),
                     SUBTASK_COL: pa.array([0] * (n + 1), pa.int32()),
                     MARKER_COL: [False] * n + [True]})


class Driver:
    """The driver's side: lineages in, meta rows out; no state file is touched here."""

    def __init__(self, tmp_path, faults=(), snapshot_every: int = 1000):
        self.storage = StorageRef(str(tmp_path / "checkpoints"), "job", {}, tuple(faults))
        self.lineages = Lineages("totals", 1, MAXP, materialize_interval_ms=3_600_000,
                                 max_changelogs=snapshot_every)
        self.epoch = -1
        self.parallelism = 1  # the rows of `worker_input` are subtask 0's at any parallelism

    def run(self, executor_root, users, amounts, *, epoch: int | None = None, record: bool = True,
            checkpoint_id: int | None = None):
        epoch = self.epoch + 1 if epoch is None else epoch
        t = EpochTask(op(), str(executor_root), epoch, self.parallelism, MAXP, None, 0, False, checkpoint_id,
                      self.storage,
                      self.lineages.for_tasks(), self.lineages.due_for_snapshot(),
                      epoch_input=self.planned(users, amounts))
        data, meta = split_meta(t(worker_input(users, amounts)), op().output_schema)
        info = json.loads(meta[0][META_INFO])
        if record:
            self.lineages.on_epoch(epoch, {0: info})
            self.epoch = epoch
        return sorted((r["user"], r["count"], r["sum"]) for r in data.to_pylist()), info

    def planned(self, users, amounts) -> EpochInput:
        """The slice of an epoch: here, its rows stand for the source positions."""
        return EpochInput(self.lineages.generation, slice_identity({"rows": repr(users)}, {"rows": repr(amounts)}))


def test_a_rerun_of_a_committed_epoch_returns_the_same_rows_without_applying_twice(tmp_path):
    d = Driver(tmp_path)
    d.run(tmp_path / "a", ["ann", "bob"], [1, 2])
    first, _ = d.run(tmp_path / "a", ["ann"], [10], record=False)
    again, info = d.run(tmp_path / "a", ["ann"], [10])  # Spark re-ran the task of epoch 1
    assert first == again == [("ann", 2, 11)]
    assert info["state"]["how"] == "retry"
    assert d.run(tmp_path / "a", ["ann"], [1])[0] == [("ann", 3, 12)]


def test_a_subtask_that_moves_to_an_executor_without_its_state_rebuilds_it_from_storage(tmp_path):
    d = Driver(tmp_path)
    d.run(tmp_path / "a", ["ann", "bob"], [1, 2])
    d.run(tmp_path / "a", ["ann"], [10])
    rows, info = d.run(tmp_path / "b", ["ann", "bob"], [100, 5])   # executor b has never seen it
    assert rows == [("ann", 3, 111), ("bob", 2, 7)]
    assert info["state"]["how"] == "rebuild" and info["state"]["replayed"] == 2
    # Back on executor a, which is two epochs behind on the same lineage: it catches up.
    rows, info = d.run(tmp_path / "a", ["bob"], [1])
    assert rows == [("bob", 3, 8)]
    assert info["state"]["how"] == "catch-up" and info["state"]["replayed"] == 1


def test_rebuild_from_a_snapshot_plus_later_change_logs(tmp_path):
    d = Driver(tmp_path, snapshot_every=2)
    for i in range(5):
        d.run(tmp_path / "a", ["ann", f"u{i}"], [1, i])
    lin = d.lineages.for_tasks()[0]
    assert lin.base is not None and lin.base_epoch >= 1 and len(lin.changelog) < 5
    rows, info = d.run(tmp_path / "b", ["ann"], [1])
    assert rows == [("ann", 6, 6)]
    assert info["state"]["how"] == "rebuild" and info["state"]["replayed"] == len(lin.changelog)


def test_local_state_ahead_of_the_restored_lineage_is_not_used(tmp_path):
    d = Driver(tmp_path)
    d.run(tmp_path / "a", ["ann"], [1])
    restored = d.lineages.handle(0)[0]
    d.run(tmp_path / "a", ["ann"], [10])
    d.run(tmp_path / "a", ["ann"], [100])
    d.lineages.restore({0: restored})   # failover to the checkpoint at epoch 0
    d.epoch = 0
    rows, info = d.run(tmp_path / "a", ["ann"], [5])
    assert rows == [("ann", 2, 6)] and info["state"]["how"] == "rebuild"


def test_storage_refusing_a_change_log_keeps_the_job_running_and_blocks_only_checkpoints(tmp_path):
    fail_chk_3 = {"op": "upload", "path": "*", "checkpoints": [3], "action": "fail"}
    d = Driver(tmp_path, faults=[fail_chk_3])
    d.run(tmp_path / "a", ["ann"], [1])
    rows, info = d.run(tmp_path / "a", ["ann"], [2], checkpoint_id=3)  # the barrier epoch's upload fails
    assert rows == [("ann", 2, 3)]
    handle, why = d.lineages.handle(0)
    assert handle is None and "epochs [1]" in why
    _, info = d.run(tmp_path / "a", ["ann"], [3])                       # storage is back
    assert info["state"]["durable_refs"]
    handle, why = d.lineages.handle(0)
    assert why is None and [f["epoch"] for f in handle["changelog"]["files"]] == [0, 1, 2]
    assert d.run(tmp_path / "b", ["ann"], [4])[0] == [("ann", 4, 10)]  # and any executor can rebuild it


def test_a_move_while_a_change_log_is_only_on_the_old_executor_fails_the_epoch_clearly(tmp_path):
    d = Driver(tmp_path, faults=[{"op": "upload", "path": "*", "action": "fail", "times": 1}])
    d.run(tmp_path / "a", ["ann"], [1])
    with pytest.raises(StaleStateError, match="never reached checkpoint storage"):
        d.run(tmp_path / "b", ["ann"], [2])


def test_a_corrupt_change_log_is_named_and_never_applied(tmp_path):
    d = Driver(tmp_path)
    d.run(tmp_path / "a", ["ann"], [1])
    entry = d.lineages.for_tasks()[0].changelog[0]
    path = tmp_path / "checkpoints" / "job" / entry.file.path
    path.write_bytes(b"x" * entry.file.size)
    with pytest.raises(CorruptSnapshotError, match=entry.file.name):
        d.run(tmp_path / "b", ["ann"], [2])


def test_after_a_restore_a_corrupt_local_copy_is_never_used(tmp_path):
    """Seed 003: RocksDB does not check data blocks on open. The first epoch after a
    restore rebuilds from files verified against the checkpoint; a local snapshot copy
    that fails verification is reported and fetched from storage instead."""
    d = Driver(tmp_path, snapshot_every=1)
    d.run(tmp_path / "a", ["ann"], [1])
    d.run(tmp_path / "a", ["ann"], [2])
    lin = d.lineages.for_tasks()[0]
    snap_dir = tmp_path / "a" / "totals" / "subtask-0" / f"snap-{lin.base_epoch}"
    sst = sorted(snap_dir.glob("*.sst"))[0]
    data = sst.read_bytes()
    sst.unlink()  # hard-linked into the db too: break only the copy
    sst.write_bytes(b"\0" * len(data))
    d.lineages.restore({0: d.lineages.handle(0)[0]})   # a restore: local disk is not trusted
    t = EpochTask(op(), str(tmp_path / "a"), d.epoch + 1, 1, MAXP, None, 0, False, None, d.storage,
                  d.lineages.for_tasks(), epoch_input=d.planned(["ann"], [3]))
    data_out, meta = split_meta(t(worker_input(["ann"], [3])), op().output_schema)
    info = json.loads(meta[0][META_INFO])
    assert info["state"]["how"] == "rebuild" and info["state"]["corrupt_local"] == [sst.name]
    assert [(r["user"], r["count"], r["sum"]) for r in data_out.to_pylist()] == [("ann", 3, 6)]


def test_change_logs_a_snapshot_replaced_are_handed_out_for_deletion_once_past_a_checkpoint(tmp_path):
    d = Driver(tmp_path, snapshot_every=2)
    for i in range(3):
        d.run(tmp_path / "a", ["ann"], [i])
    lin = d.lineages.for_tasks()[0]
    assert lin.base_epoch == 2 and lin.changelog == ()
    assert d.lineages.take_unneeded(1) == []            # no checkpoint past the snapshot yet
    unneeded = d.lineages.take_unneeded(2)
    assert len(unneeded) == 3 and all("/log/" in p for p in unneeded)   # epochs 0-2, all in the base now
    assert not set(unneeded) & {f.path for f in lin.files()}
    assert d.lineages.take_unneeded(2) == []            # handed out once


# -- a re-planned epoch is never taken for a retry ---------------------------------------
def restore_task(d: Driver, executor_root) -> dict:
    """The driver's restore job, run for subtask 0 on `executor_root`."""
    from sparkpoint.runtime.executor.subtask import RestoreTask

    t = RestoreTask(str(executor_root), d.storage, d.lineages.for_tasks(), generation=d.lineages.generation)
    _, meta = split_meta(t(pa.table({SUBTASK_COL: pa.array([0], pa.int32())})), pa.schema([]))
    return json.loads(meta[0][META_INFO])


def test_a_fresh_start_never_takes_the_failed_attempts_epoch_0_for_a_retry(tmp_path):
    """The first attempt committed epoch 0 in the local store, then failed before the
    driver recorded it (its sink could not stage). The job starts fresh, and the driver
    plans epoch 0 again, over a larger slice (a rate-limited source had more by then)."""
    d = Driver(tmp_path)
    d.run(tmp_path / "a", ["ann"], [1], record=False)
    d.lineages.reset_empty()                                        # the fresh start
    rows, info = d.run(tmp_path / "a", ["ann", "bob"], [1, 2])
    assert rows == [("ann", 1, 1), ("bob", 1, 2)], "the rows of the larger slice were dropped"
    assert info["state"]["how"] == "fresh"


def test_after_a_restore_a_store_holding_the_failed_attempts_next_epoch_is_not_a_retry(tmp_path):
    """On a cluster: checkpoint at epoch 0; the failed attempt committed epoch 1 on
    executor b. After the restore (rebuilt on executor a), epoch 1 is planned again over
    another slice and lands on b."""
    d = Driver(tmp_path)
    d.run(tmp_path / "a", ["ann"], [1])
    checkpoint = d.lineages.handle(0)[0]
    d.run(tmp_path / "b", ["ann"], [10], record=False)              # the failed attempt's epoch 1
    d.lineages.restore({0: checkpoint})
    d.epoch = 0
    restore_task(d, tmp_path / "a")
    rows, info = d.run(tmp_path / "b", ["ann"], [100])
    assert rows == [("ann", 2, 101)], "executor b returned the failed attempt's output"
    assert info["state"]["how"] == "rebuild"


def test_a_local_store_of_an_earlier_generation_is_rebuilt_not_trusted(tmp_path):
    """A store at the restored lineage's tip, on an executor the restore did not run on:
    local disk is not trusted across a restore (a crash may have damaged it)."""
    d = Driver(tmp_path)
    d.run(tmp_path / "b", ["ann"], [1])
    checkpoint = d.lineages.handle(0)[0]
    d.lineages.restore({0: checkpoint})
    restore_task(d, tmp_path / "a")
    rows, info = d.run(tmp_path / "b", ["ann"], [2])
    assert rows == [("ann", 2, 3)]
    assert info["state"]["how"] == "rebuild"


def test_the_first_epoch_after_a_restore_uses_the_store_the_restore_built(tmp_path):
    d = Driver(tmp_path)
    d.run(tmp_path / "a", ["ann"], [1])
    checkpoint = d.lineages.handle(0)[0]
    d.run(tmp_path / "a", ["ann"], [10], record=False)
    d.lineages.restore({0: checkpoint})
    d.epoch = 0
    assert restore_task(d, tmp_path / "a")["state"]["how"] == "rebuild"
    rows, info = d.run(tmp_path / "a", ["ann"], [100])
    assert rows == [("ann", 2, 101)]
    assert info["state"]["how"] == "local"


def recut(d: Driver, executor_root, parallelism: int, monkeypatch) -> None:
    """The driver's restore from a savepoint or at another parallelism
    (`StateRestore.redistribute`, the real code), its Spark job run in-process on
    `executor_root`: the old subtask's state re-cut into `parallelism` new subtasks."""
    from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
    from sparkpoint.runtime import stage
    from sparkpoint.runtime.restore import StateRestore
    from sparkpoint.state.memory import StateMemory

    def in_process(spark, task, p) -> dict[int, dict]:
        reports = {}
        for j in range(p):
            _, meta = split_meta(task(pa.table({SUBTASK_COL: pa.array([j], pa.int32())})), pa.schema([]))
            reports[j] = json.loads(meta[0][META_INFO])
        return reports

    monkeypatch.setattr(stage, "restore_state", in_process)
    old = {0: d.lineages.handle(0)[0]}
    lineages = Lineages("totals", parallelism, MAXP, materialize_interval_ms=3_600_000, max_changelogs=1000)
    state = StateRestore(None, str(executor_root), d.storage, StateMemory(), {"totals": lineages}, MAXP, "job",
                         announce=lambda line: None)
    data = CompletedCheckpointData("job", 1, 0, 0, {"job": {"epoch": d.epoch}})
    state.redistribute("totals", data, old, d.storage, savepoint=None)
    d.lineages, d.parallelism = lineages, parallelism


@pytest.mark.parametrize("parallelism", [1, 2], ids=["savepoint-restore", "rescale-1-to-2"])
def test_the_first_epoch_after_a_rescale_rebuilds_the_recut_store_again(tmp_path, monkeypatch, parallelism):
    """The restore re-cut the state into a new store on this executor; the first epoch
    must take that store, not rebuild it once more from the local snapshot copy."""
    d = Driver(tmp_path)
    d.run(tmp_path / "a", ["ann", "bob"], [1, 2])
    d.run(tmp_path / "a", ["ann"], [10])
    recut(d, tmp_path / "a", parallelism, monkeypatch)
    assert d.lineages.stats.rebuilds == parallelism  # the re-cut itself, once per new subtask
    rows, info = d.run(tmp_path / "a", ["ann"], [100])
    assert rows == [("ann", 3, 111)]
    assert info["state"]["how"] == "local", info["state"]["why"]
    assert d.lineages.stats.rebuilds == parallelism, "the first epoch rebuilt the re-cut store again"
    # The rule that proves a local store still holds: another generation rebuilds.
    d.lineages.restore({0: d.lineages.handle(0)[0]})
    rows, info = d.run(tmp_path / "a", ["ann"], [1])
    assert rows == [("ann", 4, 112)] and info["state"]["how"] == "rebuild"


def test_two_runs_of_one_job_name_with_different_checkpoint_directories_never_share_local_state(tmp_path):
    """Each run's stores are under its own directory of state.local.dir (keyed by the
    checkpoint location too); a rerun with the same checkpoint directory finds its own."""
    from sparkpoint import GeneratorSource, ParquetSink, Pipeline
    from sparkpoint.config import Settings
    from sparkpoint.runtime.jobmaster import JobMaster

    def local_root(checkpoints) -> str:
        pipeline = (Pipeline("orders").source(GeneratorSource("g", keys=10, total_events=10))
                    .stateful(op()).sink(ParquetSink(str(tmp_path / "out"))))
        settings = Settings.load(None, [f"execution.checkpointing.dir={checkpoints}",
                                        f"state.local.dir={tmp_path / 'state'}", "sparkpoint.progress=false"],
                                 base={"pipeline.name": "orders"})
        return JobMaster(pipeline, settings, spark=object()).local_root

    first, second = local_root(tmp_path / "chk-a"), local_root(tmp_path / "chk-b")
    assert first != second
    assert first == local_root(tmp_path / "chk-a")
    for root in (first, second):
        assert os.path.dirname(root) == str(tmp_path / "state") and os.path.basename(root).startswith("orders-")
