"""One subtask's keyed state: a local RocksDB directory with epoch-atomic commits.

Within an epoch every write is buffered in memory (an overlay that reads see), and
`commit_epoch` writes all of them together with the epoch marker and the epoch's
output in ONE RocksDB WriteBatch. So the directory is always at exactly one committed
epoch: an exception before `commit_epoch` leaves the previous epoch intact, a killed
process leaves an earlier whole epoch (the last ones may die in the memtable: see
`StoreOptions.wal`), and a Spark task retry of an already committed epoch returns
`last_output()` instead of applying its rows twice.

Metadata (format version, operator, key-group range, max parallelism) is recorded at
creation and checked on every open, so a directory left by another operator, another
program or another parallelism is refused instead of silently read.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import json
import os
from dataclasses import dataclass, field
from typing import Iterator, Literal, Sequence

import pyarrow as pa
import rocksdict

from sparkpoint.errors import ForeignCheckpointError, StaleStateError
from sparkpoint.state.keys import META_PREFIX, meta_key
from sparkpoint.state.memory import ENTRY_OVERHEAD, WorkerMemory

FORMAT_NAME = "sparkpoint-state"
FORMAT_VERSION = 1
NO_EPOCH = -1

_FORMAT_KEY = meta_key("format")
_EPOCH_KEY = meta_key("epoch")
_OUTPUT_KEY = meta_key("last_output")
# Which durable state this store holds (sparkpoint.state.changelog): the id of its
# committed epoch's change log (or base snapshot), the id of the epoch before it, and
# the committed epoch's change-log entry (returned again when Spark re-runs the task).
_LINEAGE_KEY = meta_key("lineage")
_DELETED = None  # overlay tombstone
_UNKNOWN = object()  # not in the read cache


@dataclass(frozen=True)
class StoreOptions:
    """RocksDB tuning for one subtask store; `to_rocksdict` is the only place that
    knows rocksdict's option setters."""

    write_buffer_size_mb: int = 32
    max_write_buffer_number: int = 2
    max_background_jobs: int = 2
    compression: Literal["lz4", "zstd", "none"] = "lz4"
    bloom_bits_per_key: float = 10.0
    # Why no write-ahead log (and so no fsync): the local store is a cache. Each epoch's
    # change log reached checkpoint storage (or the executor's pending/ directory) before
    # the epoch commits here, checkpoints reference only those, and a store found behind
    # its lineage catches up from them (or is rebuilt from the checkpoint). Without the
    # WAL a SIGKILL of the worker loses the epochs still in the memtable, never part of
    # one: an epoch is one WriteBatch, a batch lands in one memtable, and memtables are
    # flushed whole and in order, so the reopened store is at an earlier whole epoch.
    # close() and local checkpoints flush first. The WAL was a fifth of RocksDB's write
    # on a quiet machine and half of it on a loaded one (163k entries into a 500k-key
    # store: 142 instead of 177 ms quiet, 210 instead of 429 ms loaded); the fsync
    # another ~30 ms per subtask per epoch on W1 (50k keys).
    wal: bool = False
    sync_commit: bool = False  # fsync the WAL at every commit (implies wal)
    # Committed values this process has read or written, answered without RocksDB: an
    # open store is only ever written by its own process (RocksDB's LOCK), so they stay
    # true until it closes. W1 reads and rewrites the same ~50k keys per subtask every
    # epoch; RocksDB point gets were ~40% of its state work. Cleared when full. Opened
    # with a worker's shared memory (state.memory), the cache is bounded by that
    # worker's read-cache bytes instead, together with its other stores' caches.
    read_cache_entries: int = 1_000_000

    def to_rocksdict(self, shared: WorkerMemory | None = None) -> rocksdict.Options:
        """The store's options; with `shared`, its block cache and write-buffer manager
        (every store of the worker within one budget)."""
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        write_buffer = self.write_buffer_size_mb * 1024 * 1024
        if shared is not None:
            write_buffer = shared.memory.write_buffer_size(write_buffer)
        opts.set_write_buffer_size(write_buffer)
        opts.set_max_write_buffer_number(self.max_write_buffer_number)
        opts.set_max_background_jobs(self.max_background_jobs)
        opts.set_compression_type({
            "lz4": rocksdict.DBCompressionType.lz4(),
            "zstd": rocksdict.DBCompressionType.zstd(),
            "none": rocksdict.DBCompressionType.none(),
        }[self.compression])
        # Every epoch rewrites most of the keys it read, with values of the same width:
        # updating them in place keeps one memtable entry per key instead of one per
        # epoch, so writes and reads stay fast as the memtable fills (measured for 50k
        # keys: 43 instead of 62 ms per epoch's write) and a flush writes less. It needs
        # single-threaded memtable writes, which one store per task has anyway.
        opts.set_allow_concurrent_memtable_write(False)
        opts.set_inplace_update_support(True)
        # A bloom filter over the memtable's keys: windows look up mostly keys that do not
        # exist yet (new windows), and without it each such get searches the memtable's
        # skiplist (measured: 6.6 instead of 1.5 us per absent key with ~360k entries).
        opts.set_memtable_prefix_bloom_ratio(0.1)
        opts.set_memtable_whole_key_filtering(True)
        table = rocksdict.BlockBasedOptions()
        table.set_bloom_filter(self.bloom_bits_per_key, False)
        if shared is not None and shared.block_cache is not None:
            opts.set_write_buffer_manager(shared.write_buffers)
            table.set_block_cache(shared.block_cache)
            # Index and filter blocks inside the budget too (else every open SST file
            # holds its own, unbounded); level 0's stay pinned, as Flink does.
            table.set_cache_index_and_filter_blocks(True)
            table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        opts.set_block_based_table_factory(table)
        return opts

    def write_options(self) -> rocksdict.WriteOptions:
        wo = rocksdict.WriteOptions()
        wo.disable_wal = not (self.wal or self.sync_commit)
        wo.sync = self.sync_commit
        return wo


@dataclass(frozen=True)
class StoreFormat:
    """What a store directory records about itself (JSON under the format key)."""

    operator: str | None = None
    key_groups: tuple[int, int] | None = None  # [start, stop)
    max_parallelism: int | None = None
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        return json.dumps({"format": self.format, "version": self.version, "operator": self.operator,
                           "key_groups": list(self.key_groups) if self.key_groups else None,
                           "max_parallelism": self.max_parallelism}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, path: str) -> "StoreFormat":
        try:
            d = json.loads(raw)
            return cls(operator=d.get("operator"),
                       key_groups=tuple(d["key_groups"]) if d.get("key_groups") else None,
                       max_parallelism=d.get("max_parallelism"), format=d["format"], version=int(d["version"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ForeignCheckpointError(f"state directory {path} has an unreadable format record ({e}); "
                                         "it was not written by sparkpoint: point the job at another "
                                         "local state directory") from e


@dataclass
class _Overlay:
    """This epoch's uncommitted writes; None marks a delete."""

    writes: dict[bytes, bytes | None] = field(default_factory=dict)
    # The written keys in order, kept across scans: windows and timers scan once per key
    # group and write between scans, and sorting every write of the epoch for each scan
    # was ~40% of a window epoch. Keys are only ever added to `writes` within an epoch (a
    # delete is a None value) and a dict keeps insertion order, so the keys added since
    # the last look are the ones after the first len(_sorted) + len(_recent). They go to
    # the small sorted `_recent`, merged into `_sorted` when it grows past a fraction of it.
    _sorted: list[bytes] = field(default_factory=list)
    _recent: list[bytes] = field(default_factory=list)

    def sorted_keys_between(self, start: bytes, stop: bytes | None) -> list[bytes]:
        seen = len(self._sorted) + len(self._recent)
        if seen != len(self.writes):
            # Sorted runs concatenated: Timsort merges them in one linear pass.
            self._recent = sorted(self._recent + sorted(itertools.islice(self.writes, seen, None)))
            if len(self._recent) > max(4096, len(self._sorted) // 16):
                self._sorted, self._recent = sorted(self._sorted + self._recent), []
        found = _between(self._sorted, start, stop)
        recent = _between(self._recent, start, stop)
        return sorted(found + recent) if found and recent else (found or recent)


def _between(keys: list[bytes], start: bytes, stop: bytes | None) -> list[bytes]:
    lo = bisect.bisect_left(keys, start)
    return keys[lo:len(keys) if stop is None else bisect.bisect_left(keys, stop, lo)]


class SubtaskStateStore:
    """Keyed state of one (operator, subtask). Not thread-safe; one per Python worker task.

    Raises: `ForeignCheckpointError` on open if the directory holds another format or
    another operator's state; `StaleStateError` if it holds another key-group range or
    max parallelism, or is missing while `create=False`."""

    def __init__(self, path: str, db: rocksdict.Rdict, fmt: StoreFormat, options: StoreOptions,
                 shared: WorkerMemory | None = None):
        self.path = path
        self.format = fmt
        self.shared = shared  # the worker's memory this store counts against (None: unbounded)
        self._db = db
        self._options = options
        self._overlay = _Overlay()
        self._cache: dict[bytes, bytes | None] = {}
        self._epoch = _read_epoch(db)

    # -- lifecycle --------------------------------------------------------------------
    @classmethod
    def open(cls, path: str, *, create: bool = True, operator: str | None = None,
             key_groups: range | None = None, max_parallelism: int | None = None,
             options: StoreOptions = StoreOptions(), shared: WorkerMemory | None = None) -> "SubtaskStateStore":
        """`shared`: the worker's memory budget (state.memory.worker_memory); without
        it the store's memory is bounded only by `options`, per store."""
        exists = os.path.exists(os.path.join(path, "CURRENT"))
        if not exists and not create:
            raise StaleStateError(f"no local state at {path}; the driver must restore this subtask "
                                  "from a checkpoint before running it")
        os.makedirs(path, exist_ok=True)
        try:
            db = rocksdict.Rdict(path, options.to_rocksdict(shared))
        except Exception as e:  # rocksdict raises bare Exception for corruption / lock errors
            # Corrupt local files (seed 003: "Bad table magic number") must not kill the
            # job: StaleStateError makes the driver restore this subtask from a checkpoint.
            raise StaleStateError(f"cannot open local state at {path}: {e}. If another task still "
                                  "holds it, it is released when that task ends; if it is corrupt, the "
                                  "driver restores this subtask from a checkpoint") from e
        wanted = StoreFormat(operator=operator,
                             key_groups=(key_groups.start, key_groups.stop) if key_groups else None,
                             max_parallelism=max_parallelism)
        try:
            fmt = _check_format(db, path, wanted, options)
        except Exception:
            db.close()
            raise
        return cls(path, db, fmt, options, shared)

    def close(self) -> None:
        """Close without committing: uncommitted writes of this epoch are dropped; the
        committed epochs are flushed to disk (they may be in the memtable only)."""
        self._overlay = _Overlay()
        self.clear_cache()
        if self.shared is not None:
            self.shared.read_cache.release(self)
        self._db.close()  # rocksdict's close flushes the memtables first

    def flush_memtables(self) -> None:
        """Write the committed epochs in the memtables to SST files and free them (a
        store kept idle while the worker's write buffers are over their limit)."""
        self._db.flush(wait=True)

    def clear_cache(self) -> None:
        self._cache.clear()

    def cache_bytes(self) -> int:
        """What the read cache holds, counted as `_remember` charges it."""
        return _entry_bytes(self._cache)

    def __enter__(self) -> "SubtaskStateStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- epochs -----------------------------------------------------------------------
    def epoch(self) -> int:
        """The last committed epoch; -1 for a fresh store."""
        return self._epoch

    def last_output(self) -> pa.Table | None:
        raw = self._db.get(_OUTPUT_KEY)
        if raw is None:
            return None
        with pa.ipc.open_stream(raw) as reader:
            return reader.read_all()

    @property
    def pending_writes(self) -> int:
        return len(self._overlay.writes)

    def lineage(self) -> dict:
        """What `commit_epoch(..., lineage=...)` recorded last ({} for a fresh store)."""
        raw = self._db.get(_LINEAGE_KEY)
        return json.loads(raw) if raw else {}

    def pending_changes(self) -> dict[bytes, bytes | None]:
        """This epoch's uncommitted writes (None = delete): the epoch's change log."""
        return dict(self._overlay.writes)

    def apply_changes(self, keys: Sequence[bytes], values: Sequence[bytes | None]) -> None:
        """Buffer a replayed change log (None deletes), to be committed like any epoch."""
        self._overlay.writes.update(zip(keys, values))

    def commit_epoch(self, epoch: int, output: pa.Table, lineage: dict | None = None) -> None:
        """Make this epoch's writes, the epoch marker, `output` and `lineage` durable in
        one atomic WriteBatch. Raises StaleStateError if `epoch` does not move forward."""
        if epoch <= self._epoch:
            raise StaleStateError(f"state at {self.path} is already at epoch {self._epoch}; "
                                  f"cannot commit epoch {epoch} again")
        batch = rocksdict.WriteBatch(raw_mode=True)
        # In key order: RocksDB inserts a sorted batch into its memtable 3-5x faster than
        # a random one (measured, 300k window writes: ~110 instead of ~450 ms; the sort
        # and the slower walk cost ~200 ms back). Scans of this epoch have sorted most of
        # the keys already.
        keys = self._overlay.sorted_keys_between(b"", None)
        values = list(map(self._overlay.writes.__getitem__, keys))
        if not values.count(_DELETED):
            # Puts only (keyed aggregates): one map() loop in C instead of a Python loop per
            # key (~0.75 us per key, more than the puts themselves).
            _drain(map(batch.put, keys, values))
        else:
            # With deletes (windows, timers) one pass is cheaper than splitting the batch
            # (measured on W2's shape: 306-339 instead of 378-398 ms per commit).
            put, delete = batch.put, batch.delete
            for key, value in zip(keys, values):
                if value is None:
                    delete(key)
                else:
                    put(key, value)
        batch.put(_EPOCH_KEY, epoch.to_bytes(8, "big", signed=True))
        batch.put(_OUTPUT_KEY, _ipc_bytes(output))
        if lineage is not None:
            batch.put(_LINEAGE_KEY, json.dumps(lineage, sort_keys=True).encode())
        self._db.write(batch, self._options.write_options())
        self._remember(self._overlay.writes)
        self._overlay = _Overlay()
        self._epoch = epoch

    def relabel(self, lineage: dict) -> None:
        """Replace the record of the last commit without changing the state (the
        executor marks a store it has just rebuilt and verified as its own)."""
        self._db.put(_LINEAGE_KEY, json.dumps(lineage, sort_keys=True).encode(), self._options.write_options())

    def _remember(self, committed: dict[bytes, bytes | None]) -> None:
        if self.shared is not None and self.shared.memory.managed:
            if self.shared.read_cache.charge(self, _entry_bytes(committed)):
                self._cache.update(committed)
            else:
                self._cache.clear()
            return
        if len(self._cache) + len(committed) > self._options.read_cache_entries:
            self._cache.clear()
            if len(committed) > self._options.read_cache_entries:
                return
        self._cache.update(committed)

    def discard_pending(self) -> None:
        """Forget this epoch's uncommitted writes (state stays at `epoch()`)."""
        self._overlay = _Overlay()

    def create_local_checkpoint(self, path: str) -> None:
        """Hard-link a consistent copy of the committed state to `path` (which must not
        exist; its parent is created). Call after `commit_epoch`."""
        if self._overlay.writes:
            raise StaleStateError(f"state at {self.path} has {len(self._overlay.writes)} uncommitted "
                                  "writes; commit the epoch before taking a local checkpoint")
        if os.path.exists(path):
            raise FileExistsError(f"local checkpoint directory {path} already exists")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        # Without the WAL the committed epochs since the last flush are in the memtable
        # only, and a checkpoint copies SST files: flush them first.
        self._db.flush(wait=True)
        rocksdict.Checkpoint(self._db).create_checkpoint(path)

    # -- reads (see this epoch's writes) -----------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        if key in self._overlay.writes:
            return self._overlay.writes[key]
        value = self._cache.get(key, _UNKNOWN)
        if value is _UNKNOWN:
            value = self._db.get(key)
            self._remember({key: value})
        return value

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values for `keys` in order (None where absent)."""
        if not keys:
            return []
        # Point gets through map() measured 2.5x faster than rocksdict's list multi-get
        # (0.28 s vs 0.72 s for 300k keys, memtable or SST): its per-call overhead is
        # lower than the multi-get's key/value vector marshalling.
        values = list(map(self._cache.get, keys, itertools.repeat(_UNKNOWN, len(keys))))
        misses = [i for i, v in enumerate(values) if v is _UNKNOWN]
        if misses:
            fetched = list(map(self._db.get, [keys[i] for i in misses]))
            for i, value in zip(misses, fetched):
                values[i] = value
            self._remember(dict(zip([keys[i] for i in misses], fetched)))
        writes = self._overlay.writes
        if writes:
            for i, key in enumerate(keys):
                if key in writes:
                    values[i] = writes[key]
        return values

    def scan_prefix(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Entries whose key starts with `prefix`, in key order."""
        return self.scan_range(prefix, _prefix_end(prefix))

    def scan_range(self, start: bytes, stop: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Entries with start <= key < stop (stop None: to the end), in key order, as of
        the call (writes made while iterating may or may not be seen)."""
        if stop is None and not start.startswith(META_PREFIX):
            stop = META_PREFIX  # user scans never run into store metadata
        ropts = rocksdict.ReadOptions()
        if stop is not None:
            ropts.set_iterate_upper_bound(stop)
        pending = self._overlay.sorted_keys_between(start, stop)
        if not pending:
            # Nothing of this epoch's writes in range: RocksDB's own iterator, stepped in
            # Rust (window fire scans yield ~200k committed entries per subtask per epoch;
            # the merging generator below cost ~2 us each).
            return _keeping(self._db.items(from_key=start, read_opt=ropts), ropts)
        return self._merged_scan(start, ropts, pending)

    def _merged_scan(self, start: bytes, ropts: rocksdict.ReadOptions,
                     pending: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
        writes = self._overlay.writes
        it = self._db.iter(ropts)
        it.seek(start)
        i = 0
        while it.valid():
            key = it.key()
            # Emit overlay keys that sort before the next committed key.
            while i < len(pending) and pending[i] < key:
                if writes[pending[i]] is not None:
                    yield pending[i], writes[pending[i]]  # type: ignore[misc]
                i += 1
            if i < len(pending) and pending[i] == key:
                if writes[key] is not None:
                    yield key, writes[key]  # type: ignore[misc]
                i += 1
            else:
                yield key, it.value()
            it.next()
        for k in pending[i:]:
            if writes[k] is not None:
                yield k, writes[k]  # type: ignore[misc]

    def read_prefix(self, prefix: bytes) -> dict[bytes, bytes]:
        """Every entry whose key starts with `prefix`, as a dict; the committed ones are
        kept in the read cache too. Cheaper than point gets when most of them are wanted."""
        found = dict(self.scan_prefix(prefix))
        writes = self._overlay.writes
        self._remember({k: v for k, v in found.items() if k not in writes})
        return found

    def estimated_entries(self) -> int:
        """RocksDB's estimate of the committed entries (deletes not yet compacted away
        count against it) plus this epoch's writes: for choosing between scans and gets."""
        estimate = self._db.property_int_value("rocksdb.estimate-num-keys") or 0
        return int(estimate) + len(self._overlay.writes)

    def has_prefix(self, prefix: bytes) -> bool:
        return next(iter(self.scan_prefix(prefix)), None) is not None

    # -- writes (buffered until commit_epoch) ------------------------------------------
    def put(self, key: bytes, value: bytes) -> None:
        self._overlay.writes[key] = value

    def put_many(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"put_many got {len(keys)} keys but {len(values)} values")
        self._overlay.writes.update(zip(keys, values))

    def delete(self, key: bytes) -> None:
        self._overlay.writes[key] = _DELETED

    def delete_many(self, keys: Sequence[bytes]) -> None:
        self._overlay.writes.update(dict.fromkeys(keys, _DELETED))

    # -- operator metadata (counters etc.; committed with the epoch) -------------------
    def get_meta(self, name: str) -> bytes | None:
        return self.get(meta_key("op/" + name))

    def put_meta(self, name: str, value: bytes) -> None:
        self.put(meta_key("op/" + name), value)


# -- helpers ----------------------------------------------------------------------------
def _entry_bytes(entries: dict[bytes, bytes | None]) -> int:
    """Memory `entries` take in a read cache: keys, values and per-entry overhead (an
    overwrite counts again; the budget counts exactly before it evicts anything)."""
    return (sum(map(len, entries)) + sum(map(len, filter(None, entries.values())))
            + ENTRY_OVERHEAD * len(entries))


def _drain(calls: Iterator) -> None:
    collections.deque(calls, maxlen=0)


def _keeping(entries: Iterator[tuple[bytes, bytes]], read_options: rocksdict.ReadOptions):
    """`entries`, holding `read_options` until they are consumed: RocksDB keeps only a
    pointer to the iterate upper bound, freed with the options object (seen: a scan ran
    past its bound into other namespaces)."""
    yield from entries


def _ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _read_epoch(db: rocksdict.Rdict) -> int:
    raw = db.get(_EPOCH_KEY)
    return NO_EPOCH if raw is None else int.from_bytes(raw, "big", signed=True)


def _prefix_end(prefix: bytes) -> bytes | None:
    """Smallest key greater than every key starting with `prefix`."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


def _is_empty(db: rocksdict.Rdict) -> bool:
    it = db.iter()
    it.seek_to_first()
    return not it.valid()


def _check_format(db: rocksdict.Rdict, path: str, wanted: StoreFormat, options: StoreOptions) -> StoreFormat:
    raw = db.get(_FORMAT_KEY)
    if raw is None:
        if not _is_empty(db):
            raise ForeignCheckpointError(f"{path} holds a RocksDB database without a sparkpoint format "
                                         "record; it was written by something else. Point the job at "
                                         "another local state directory")
        db.put(_FORMAT_KEY, wanted.to_json(), options.write_options())
        return wanted
    found = StoreFormat.from_json(raw, path)
    if found.format != FORMAT_NAME or found.version != FORMAT_VERSION:
        raise ForeignCheckpointError(f"state at {path} has format {found.format!r} version {found.version}; "
                                     f"this sparkpoint reads {FORMAT_NAME!r} version {FORMAT_VERSION}")
    if wanted.operator is not None and found.operator is not None and wanted.operator != found.operator:
        raise ForeignCheckpointError(f"state at {path} belongs to operator {found.operator!r}, not "
                                     f"{wanted.operator!r}; check the job's operator names and state dirs")
    for what, have, want in (("key-group range", found.key_groups, wanted.key_groups),
                             ("max parallelism", found.max_parallelism, wanted.max_parallelism)):
        if want is not None and have is not None and have != want:
            raise StaleStateError(f"state at {path} was written for {what} {have}, the job now expects "
                                  f"{want}; restore this subtask from a checkpoint (rescaling needs a restore)")
    return found


__all__ = ["SubtaskStateStore", "StoreOptions", "StoreFormat", "NO_EPOCH", "FORMAT_VERSION"]
