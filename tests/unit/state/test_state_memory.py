"""The keyed state of one Spark Python worker stays within
`state.backend.rocksdb.memory.*`: block cache, memtables and sparkpoint's read cache of
every store the worker keeps open, counted together (sparkpoint/state/memory.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from sparkpoint.config import Settings
from sparkpoint.errors import ConfigError
from sparkpoint.runtime.executor import kept_stores
from sparkpoint.state.memory import MiB, StateMemory, WorkerMemory
from sparkpoint.state.store import StoreOptions, SubtaskStateStore

REPO = Path(__file__).resolve().parents[3]
EMPTY = pa.table({})

# A worker that runs the epochs of many subtasks one after another, as an executor's
# Python worker does when Spark hands it whichever subtask is next: each task opens its
# subtask's store, writes and reads it, and keeps it open (kept_stores). It reports how
# much its resident memory grew over the run.
_WORKER = textwrap.dedent("""
    import json, os, sys
    import pyarrow as pa
    from sparkpoint.runtime.executor import kept_stores
    from sparkpoint.state.memory import StateMemory, worker_memory
    from sparkpoint.state.store import StoreOptions, SubtaskStateStore

    def rss():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

    root, managed, budget, subtasks, entries, epochs = sys.argv[1:]
    subtasks, entries, epochs = int(subtasks), int(entries), int(epochs)
    kept_stores._in_spark_task = lambda: True  # keep stores as a Spark worker does
    memory = StateMemory(managed=managed == "managed", fixed_per_slot=int(budget))
    base = rss()
    peak = 0
    per_epoch = entries // epochs
    for i in range(subtasks):
        db = os.path.join(root, f"subtask-{i}", "db")
        store = SubtaskStateStore.open(db, options=StoreOptions(), shared=worker_memory(memory))
        kept_stores.opened(db)
        for epoch in range(epochs):
            keys = [b"k%03d-%09d" % (i, n) for n in range(epoch * per_epoch, (epoch + 1) * per_epoch)]
            store.put_many(keys, [os.urandom(16) + b"v" * 200 for _ in keys])
            store.commit_epoch(epoch, pa.table({}))
            got = store.get_many(keys[::3])
            assert all(v is not None and len(v) == 216 for v in got)
            del keys, got
        kept_stores.keep(db, store)
        peak = max(peak, rss())
    print(json.dumps({"growth": peak - base, "kept": len(kept_stores._kept)}))
""")


def _run_worker(tmp: Path, managed: bool, budget: int, subtasks: int, entries: int, epochs: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, str(tmp), "managed" if managed else "unmanaged", str(budget),
         str(subtasks), str(entries), str(epochs)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_worker_with_many_subtask_stores_stays_within_its_state_memory_budget(tmp_path: Path) -> None:
    """Ten subtasks' stores in one worker, 11 MB of committed values each (and every one
    read again): with the budget the worker's resident memory grows by no more than the
    budget plus a fixed allowance for what no budget holds (the epoch's own writes in
    Python, RocksDB's flush and compaction buffers, the allocators' slack; ~25 MB
    measured). With the old unbounded settings the same work grows far past that, so
    the bound is what holds it."""
    budget = 64 * MiB
    allowance = 40 * MiB
    bounded = _run_worker(tmp_path / "bounded", True, budget, subtasks=10, entries=50_000, epochs=5)
    assert bounded["kept"] == StateMemory().kept_stores
    assert bounded["growth"] <= budget + allowance, (
        f"the worker grew by {bounded['growth'] / MiB:.0f} MB with a {budget / MiB:.0f} MB state budget")

    unbounded = _run_worker(tmp_path / "unbounded", False, budget, subtasks=10, entries=50_000, epochs=5)
    assert unbounded["growth"] > budget + allowance, (
        f"without the budget the worker grew by only {unbounded['growth'] / MiB:.0f} MB: this test would not "
        "notice a budget that holds nothing")


def _keep(db_dir: str, memory: WorkerMemory, epochs: int = 1, entries: int = 10) -> SubtaskStateStore:
    store = SubtaskStateStore.open(db_dir, options=StoreOptions(), shared=memory)
    kept_stores.opened(db_dir)
    for epoch in range(epochs):
        store.put_many([b"k%06d" % n for n in range(entries)], [b"v%d" % epoch * 100] * entries)
        store.commit_epoch(epoch, EMPTY)
    kept_stores.keep(db_dir, store)
    return store


@pytest.fixture
def spark_worker(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(kept_stores, "_in_spark_task", lambda: True)
    yield
    for db_dir in list(kept_stores._kept):
        kept_stores.release(db_dir)


def test_a_worker_keeps_no_more_stores_open_than_kept_stores(tmp_path: Path, spark_worker) -> None:
    memory = WorkerMemory(StateMemory(kept_stores=2))
    dirs = [str(tmp_path / f"subtask-{i}" / "db") for i in range(4)]
    for db_dir in dirs:
        _keep(db_dir, memory)
    assert sorted(kept_stores._kept) == sorted(dirs[2:]), "the two most recently used stay open"
    assert all(kept_stores._lock_free(d) for d in dirs[:2]), "the others are closed (their lock is free)"


def test_idle_stores_give_back_their_memtables_when_the_worker_is_over_its_write_buffers(
        tmp_path: Path, spark_worker) -> None:
    """RocksDB flushes only the store being written to; memtables of idle stores would
    otherwise stay, one set per kept store."""
    memory = WorkerMemory(StateMemory(fixed_per_slot=16 * MiB))
    limit = memory.memory.write_buffer_manager_bytes
    for i in range(6):
        _keep(str(tmp_path / f"subtask-{i}" / "db"), memory, epochs=3, entries=4000)
        assert memory.write_buffers.get_usage() <= limit, i
    assert len(kept_stores._kept) == 6


def test_read_caches_of_one_worker_share_one_budget_and_reads_stay_exact(tmp_path: Path) -> None:
    """The other store's cache goes first; a store's own cache goes when it alone is
    over; every read still returns the committed value."""
    memory = WorkerMemory(StateMemory(fixed_per_slot=16 * MiB, read_cache_ratio=0.01))  # ~168 kB
    limit = memory.read_cache.limit
    a = SubtaskStateStore.open(str(tmp_path / "a"), shared=memory)
    b = SubtaskStateStore.open(str(tmp_path / "b"), shared=memory)
    try:
        committed = {}
        for epoch, store in enumerate([a, b, b, a, b]):
            keys = [b"%s-%05d" % (store.path[-1:].encode(), n) for n in range(epoch * 300, epoch * 300 + 300)]
            values = [b"x%d" % n * 20 for n in range(300)]
            store.put_many(keys, values)
            store.commit_epoch(epoch, EMPTY)
            committed.update(zip(keys, values))
            assert memory.read_cache.used() <= limit
            assert a.cache_bytes() + b.cache_bytes() <= limit
        for store in (a, b):
            mine = [k for k in committed if k.startswith(store.path[-1:].encode())]
            assert store.get_many(mine) == [committed[k] for k in mine]
            assert memory.read_cache.used() <= limit
    finally:
        a.close()
        b.close()
    assert memory.read_cache.used() == 0, "closed stores hold nothing"


def test_state_memory_keys_take_flink_sizes_and_refuse_bad_values_with_one_line() -> None:
    settings = Settings.load(sets=["state.backend.rocksdb.memory.fixed-per-slot=1 gb",
                                   "state.backend.rocksdb.memory.write-buffer-ratio=0.4",
                                   "state.backend.rocksdb.memory.kept-stores=3"])
    memory = StateMemory.from_settings(settings)
    assert (memory.fixed_per_slot, memory.write_buffer_ratio, memory.kept_stores) == (1 << 30, 0.4, 3)
    assert memory.managed and memory.read_cache_bytes == 256 * MiB
    assert memory.block_cache_bytes + memory.write_buffer_manager_bytes // 2 <= memory.rocksdb_bytes
    with pytest.raises(ConfigError, match=r"^bad value for state.backend.rocksdb.memory.fixed-per-slot: 'lots': "
                                          r"'lots' is not a memory size; use e.g. '256 mb', '1 gb'$"):
        Settings.load(sets=["state.backend.rocksdb.memory.fixed-per-slot=lots"])
    with pytest.raises(ConfigError, match="write-buffer-ratio: 1.5: must be between 0 and 1"):
        Settings.load(sets=["state.backend.rocksdb.memory.write-buffer-ratio=1.5"])


def test_a_jobs_state_memory_settings_reach_the_store_its_epoch_task_keeps_open(tmp_path: Path, spark_worker) -> None:
    """From the job's keys to the task shipped to the workers, to the store the worker
    keeps: it counts against a worker budget of exactly those settings."""
    from sparkpoint import GeneratorSource, Pipeline
    from sparkpoint.api import KeyedAggregate
    from sparkpoint.connectors.parquet_sink import ParquetSink
    from sparkpoint.runtime.executor.storage import StorageRef
    from sparkpoint.runtime.executor.store_opening import EpochInput
    from sparkpoint.runtime.executor.subtask import EpochTask
    from sparkpoint.runtime.jobmaster import JobMaster
    from sparkpoint.runtime.lineages import Lineages
    from sparkpoint.state.interfaces import KEY_GROUP_COL, MARKER_COL, SUBTASK_COL

    operator = KeyedAggregate("totals", ["user"], "amount", aggs=("count", "sum"), value_type="bigint",
                              key_schema="user STRING")
    settings = Settings.load(overrides={
        "pipeline.name": "sized", "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.backend.rocksdb.memory.fixed-per-slot": "48 mb", "state.backend.rocksdb.memory.kept-stores": 3,
        "state.backend.rocksdb.memory.read-cache-ratio": 0.5})
    job = JobMaster(Pipeline("sized").source(GeneratorSource("g", keys=4, total_events=4)).stateful(operator)
                    .sink(ParquetSink(str(tmp_path / "out"))), settings)
    assert job.state_memory == StateMemory(fixed_per_slot=48 * MiB, kept_stores=3, read_cache_ratio=0.5)

    lineages = Lineages("totals", 1, 8, materialize_interval_ms=3_600_000, max_changelogs=100)
    task = EpochTask(operator, str(tmp_path / "executor"), 0, 1, 8, None, 0, False, None,
                     StorageRef(str(tmp_path / "chk"), "sized", {}, ()), lineages.for_tasks(), frozenset(),
                     epoch_input=EpochInput(lineages.generation, "slice-0"), memory=job.state_memory)
    rows = pa.table({"user": ["ann", None], "__count": [1, None], "__nvalues": [1, None], "__sum": [5, None],
                     "__min": [5, None], "__max": [5, None], KEY_GROUP_COL: pa.array([0, None], pa.int32()),
                     SUBTASK_COL: pa.array([0, 0], pa.int32()), MARKER_COL: [False, True]})
    task(rows)
    [kept] = [k.store for k in kept_stores._kept.values()]
    assert kept.shared is not None and kept.shared.memory == job.state_memory
    assert kept.shared.read_cache.limit == 24 * MiB
