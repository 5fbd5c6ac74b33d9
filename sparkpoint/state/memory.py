"""How much memory the keyed state of one Spark Python worker may take.

A Python worker runs one task at a time, like a task slot in Flink, and keeps the stores
of the subtasks it ran open between epochs (runtime/executor/kept_stores.py). All of that
is native or Python heap outside Spark's memory accounting, so it is bounded per worker
the way Flink bounds RocksDB per slot (`state.backend.rocksdb.memory.*`):

    fixed-per-slot                              the worker's budget, split into
      read-cache-ratio x budget                 committed values sparkpoint keeps in Python
      the rest, R, for RocksDB:
        one block cache of (3 - w) / 3 x R      data, index and filter blocks of every store
        one write-buffer manager of 2 w / 3 x R memtables of every store, charged to the cache

with w = write-buffer-ratio (Flink's split: the manager may let the mutable memtables
overshoot by half before it forces a flush, so it is given two thirds of its share).
Memtables of stores kept idle are flushed while the manager is over its limit (RocksDB
only flushes the store being written to), and `kept-stores` caps how many stay open.

`managed: false` restores unbounded per-store settings: each store has its own 2 x 32 MB
memtables, RocksDB's default block cache and a read cache of up to a million entries.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import rocksdict

MiB = 1024 * 1024

# Bytes a cached entry costs beyond its key and value: two bytes objects' headers and
# the dict's slot, index and spare room (tracemalloc, CPython 3.11, 200k entries: 117).
ENTRY_OVERHEAD = 120


@dataclass(frozen=True)
class StateMemory:
    """The `state.backend.rocksdb.memory.*` settings; shipped with every state task."""

    managed: bool = True
    fixed_per_slot: int = 256 * MiB
    write_buffer_ratio: float = 0.5
    read_cache_ratio: float = 0.25
    kept_stores: int = 8

    @classmethod
    def from_settings(cls, settings: Any) -> "StateMemory":
        """From a job's `Settings` (sparkpoint.config)."""
        return cls(managed=settings.rocksdb_memory_managed, fixed_per_slot=settings.rocksdb_memory_per_slot,
                   write_buffer_ratio=settings.rocksdb_write_buffer_ratio,
                   read_cache_ratio=settings.rocksdb_read_cache_ratio, kept_stores=settings.rocksdb_kept_stores)

    @property
    def read_cache_bytes(self) -> int:
        return int(self.fixed_per_slot * self.read_cache_ratio)

    @property
    def rocksdb_bytes(self) -> int:
        return self.fixed_per_slot - self.read_cache_bytes

    @property
    def block_cache_bytes(self) -> int:
        return int((3 - self.write_buffer_ratio) * self.rocksdb_bytes / 3)

    @property
    def write_buffer_manager_bytes(self) -> int:
        return int(2 * self.rocksdb_bytes * self.write_buffer_ratio / 3)

    def write_buffer_size(self, wanted: int) -> int:
        """One store's memtable size: `wanted`, but no more than a quarter of the
        manager's limit, so that the active store flushes (rather than every writer
        stalling) before the limit is reached."""
        if not self.managed:
            return wanted
        return max(1 * MiB, min(wanted, self.write_buffer_manager_bytes // 4))


class ReadCacheBudget:
    """The bytes every store's read cache of this worker may hold together. A store
    charges what it adds; past the limit the caches of other stores go first (least
    recently charged), then the charging store's own."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._charged: dict[int, int] = {}  # id(cache owner) -> bytes charged
        self._owners: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def charge(self, owner: Any, nbytes: int) -> bool:
        """Account `nbytes` more for `owner`'s cache. False: they do not fit even
        alone; the owner then keeps its cache empty. May clear caches, `owner`'s too."""
        with self._lock:
            key = id(owner)
            self._owners[key] = owner
            self._charged[key] = self._charged.pop(key, 0) + nbytes  # most recently charged last
            if self._total() <= self.limit:
                return True
            self._charged[key] = owner.cache_bytes() + nbytes  # overwrites were counted twice
            for other in [k for k in self._charged if k != key]:
                if self._total() <= self.limit:
                    return True
                victim = self._owners.get(other)
                if victim is not None:
                    victim.clear_cache()
                del self._charged[other]
            if self._total() <= self.limit:
                return True
            owner.clear_cache()
            fits = nbytes <= self.limit
            self._charged[key] = nbytes if fits else 0
            return fits

    def release(self, owner: Any) -> None:
        with self._lock:
            self._charged.pop(id(owner), None)
            self._owners.pop(id(owner), None)

    def used(self) -> int:
        with self._lock:
            return self._total()

    def _total(self) -> int:
        return sum(self._charged.values())


class WorkerMemory:
    """The memory shared by every store one worker process opens with `memory`."""

    def __init__(self, memory: StateMemory) -> None:
        self.memory = memory
        self.read_cache = ReadCacheBudget(memory.read_cache_bytes)
        self.block_cache: rocksdict.Cache | None = None
        self.write_buffers: rocksdict.WriteBufferManager | None = None
        if memory.managed:
            self.block_cache = rocksdict.Cache(memory.block_cache_bytes)
            self.write_buffers = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
                memory.write_buffer_manager_bytes, False, self.block_cache)

    def over_write_buffer_limit(self) -> bool:
        buffers = self.write_buffers
        return buffers is not None and buffers.get_usage() > self.memory.write_buffer_manager_bytes


_lock = threading.Lock()
_worker: WorkerMemory | None = None


def worker_memory(memory: StateMemory) -> WorkerMemory:
    """This process's shared state memory for `memory` (made on first use). A task with
    other settings (another job in the same worker) gets new ones; stores opened with
    the old ones keep them until they close."""
    global _worker
    with _lock:
        if _worker is None or _worker.memory != memory:
            _worker = WorkerMemory(memory)
        return _worker


__all__ = ["StateMemory", "WorkerMemory", "ReadCacheBudget", "worker_memory", "ENTRY_OVERHEAD", "MiB"]
