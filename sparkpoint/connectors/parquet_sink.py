"""Exactly-once Parquet files, committed with the checkpoint that covers them, on a local
path, NFS or an object store (`s3://bucket/prefix`), with no atomic rename needed.

Layout under `path` (docs/output.md has the full story):

    _staging/epoch=<e>/part-<task>-<uuid>.parquet   staged by an executor task; never read
    epoch=<e>/part-<task>-<uuid>.parquet            published (renamed on local disk,
                                                    copied on object stores)
    _spark_metadata/<batch>[.compact]               Spark's file sink log: the committed files

`spark.read.parquet(path)` follows `_spark_metadata` and reads exactly the committed files
(with an `epoch` column from the directory names); a plain directory listing that skips
`_`-prefixed entries sees the same files on local disk once any restore has run.

Commit protocol (each step idempotent; what a crash at each step leaves):
  1. executor: `ParquetEpochWriter.write(e, part, rows)` writes one Parquet file per task
     attempt under `_staging/`, durably (fsync / one PUT), and returns a handle
     {epoch, part, path, size, sha256, rows}. Crash: the file is an orphan; the attempt
     that wins reports its own file; `recover` removes all of `_staging/`.
  2. driver: `stage_epoch(e, handles)` remembers the winning tasks' handles (no I/O).
  3. `pre_commit(cid)`: the checkpoint's handle lists every staged, uncommitted file up
     to the barrier (files of failed checkpoints included: their rows are in the state
     the next checkpoint captures) and `last_epoch`. Crash: as 1.
  4. `_metadata` of cid is written by the coordinator. Crash after it: `recover(handle)`
     runs step 5 for cid.
  5. `commit(handle)`: verify every file the log does not list yet (the staged size),
     then publish them (rename on local, copy on object stores; none if any is damaged,
     so a refused checkpoint leaves nothing a directory reader sees), then create the
     next log batch naming them, exclusively. Crash before the batch: the published files are listed by
     nobody; a re-run finds them published and writes the batch. A file both staged and
     published nowhere fails with CorruptCheckpointError naming it.
  6. `recover(handle)`: re-runs 5 for the restored checkpoint (checking sha256 too on
     local disk), then withdraws every committed file of an epoch after the restored
     checkpoint's `last_epoch` (a restore that fell back past a corrupt newer checkpoint):
     a new compact log batch without them, then their files are deleted; published files
     the log does not list are deleted; `_staging/` is emptied.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.registry import known_implementations

from sparkpoint.connectors.base import EpochWriter, Sink
from sparkpoint.connectors.spark_file_log import DEFAULT_INTERVAL, LOG_DIR, LogState, SparkFileLog, entry
from sparkpoint.errors import ConfigError, CorruptCheckpointError, StorageError
from sparkpoint.storage.fs import StorageFS, fsync_dir
from sparkpoint.storage.objectstore import supports_exclusive_create

log = logging.getLogger(__name__)

STAGING = "_staging"
HANDLE_VERSION = 1
_EPOCH_DIR = re.compile(r"^epoch=(\d+)$")
_STAGED = re.compile(r"^_staging/epoch=(\d{8,})/part-(\d{5,})-([0-9a-f]{32})\.parquet$")
_PUBLISHED = re.compile(r"^epoch=(\d{8,})/part-(\d{5,})-([0-9a-f]{32})\.parquet$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# fsspec protocols whose paths Spark reads under another scheme (Hadoop's S3A connector).
_SPARK_SCHEMES = {"s3": "s3a", "s3a": "s3a", "file": "file", "local": "file"}


def epoch_dir(epoch: int) -> str:
    return f"epoch={epoch:08d}"


def resolve_output_url(path: str | os.PathLike) -> str:
    """A local path becomes absolute; a URL (`s3://bucket/prefix`) stays a URL. A string
    that starts like a known protocol but is not a URL (`s3:/bucket`) is refused rather
    than becoming a local directory named `s3:`."""
    text = os.fspath(path)
    if "://" in text:
        return text.rstrip("/")
    prefix = text.split(":", 1)[0] if ":" in text else None
    if prefix and prefix.lower() in known_implementations:
        raise ConfigError(f"sink path {text!r} looks like a {prefix}:// URL but is not one; "
                          f"write it as {prefix}://bucket/prefix (or ./{text} for a local directory)")
    return os.path.abspath(text)


def _open(url: str, storage_options: Mapping[str, Any] | None) -> StorageFS:
    return StorageFS.from_url(url, storage_options=dict(storage_options or {}))


def _protocol(storage: StorageFS) -> str:
    protocol = storage.fs.protocol
    return protocol[0] if isinstance(protocol, (tuple, list)) else protocol


@dataclass(frozen=True)
class ParquetEpochWriter(EpochWriter):
    """Runs on executors: stages one task's rows of one epoch as one Parquet file under
    a name unique to the attempt, durable before `write` returns."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    compression: str = "snappy"

    def write(self, epoch: int, part: int, rows: pa.Table) -> list[dict[str, Any]]:
        if rows.num_rows == 0:
            return []
        sink = pa.BufferOutputStream()
        pq.write_table(rows, sink, compression=self.compression)
        data = sink.getvalue()
        relative = f"{STAGING}/{epoch_dir(epoch)}/part-{part:05d}-{uuid.uuid4().hex}.parquet"
        storage = _open(self.url, self.storage_options)
        target = f"{storage.root}/{relative}"
        if storage.is_local:
            directory = os.path.dirname(target)
            os.makedirs(directory, exist_ok=True)
            with open(target, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(directory)
            fsync_dir(os.path.dirname(directory))
        else:
            storage.fs.pipe_file(target, data.to_pybytes())  # one PUT: durable once acknowledged
        return [{"epoch": int(epoch), "part": int(part), "path": relative, "size": data.size,
                 "sha256": hashlib.sha256(data).hexdigest(), "rows": rows.num_rows}]


class ParquetSink(Sink):
    read_hint = "read it with spark.read.parquet(...): committed output only"
    """`path`: a local directory or an fsspec URL (`s3://bucket/prefix`, with
    `storage_options` for s3fs). `spark_scheme`: the URI scheme Spark readers use for the
    output (default: `file` for local paths, `s3a` for S3): the log names files with it.
    `compact_interval`: Spark's `spark.sql.streaming.fileSink.log.compactInterval` of the
    readers (default 10, Spark's default)."""

    def __init__(self, path: str | os.PathLike, name: str = "parquet",
                 storage_options: dict[str, Any] | None = None, spark_scheme: str | None = None,
                 compact_interval: int = DEFAULT_INTERVAL, compression: str = "snappy"):
        self.path = resolve_output_url(path)
        self.name = name
        self.storage_options = dict(storage_options or {})
        self.compression = compression
        self._storage = _open(self.path, self.storage_options)
        protocol = _protocol(self._storage)
        self.spark_scheme = spark_scheme or _SPARK_SCHEMES.get(protocol, protocol)
        self._log = SparkFileLog(self._storage, self.spark_scheme, compact_interval)
        self._lock = threading.Lock()          # _staged, _last_epoch (epoch loop vs committer)
        self._commit_lock = threading.Lock()   # commit / recover, and the cached log state
        self._staged: dict[str, dict[str, Any]] = {}
        self._last_epoch = -1
        self._state: LogState | None = None

    @property
    def root(self) -> str:
        return self._storage.root

    def _abs(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    # -- lifecycle ---------------------------------------------------------------------
    @property
    def location(self) -> str | None:
        return self.path

    def open(self, job_name: str) -> None:
        if not supports_exclusive_create(self._storage.fs):
            raise ConfigError(f"sink {self.name}: output {self.path} is on {_protocol(self._storage)}://, which "
                              f"cannot create a file exclusively; the commit log needs it. Use a local/NFS path "
                              f"or an S3-compatible store (s3://)")
        if self._storage.is_local:
            self._storage.makedirs(self.root)

    def epoch_writer(self) -> ParquetEpochWriter:
        return ParquetEpochWriter(self.path, dict(self.storage_options), self.compression)

    # -- staging (driver: handles only) ------------------------------------------------
    def stage_epoch(self, epoch: int, handles: list[dict[str, Any]]) -> None:
        files = [_validate_file(h, f"epoch {epoch} task handle") for h in handles]
        for f in files:
            if f["epoch"] != epoch:
                raise ValueError(f"sink {self.name}: a handle of epoch {f['epoch']} was reported for epoch {epoch}")
        with self._lock:
            for f in files:
                self._staged[f["path"]] = f
            self._last_epoch = max(self._last_epoch, int(epoch))

    def write_epoch(self, epoch: int, rows: pa.Table) -> None:
        """Driver-side staging (the rows were collected): as one task with part 0."""
        self.stage_epoch(epoch, self.epoch_writer().write(epoch, 0, rows))

    def pre_commit(self, checkpoint_id: int) -> Mapping[str, Any]:
        with self._lock:
            files = sorted(self._staged.values(), key=lambda f: (f["epoch"], f["part"], f["path"]))
            return {"v": HANDLE_VERSION, "checkpoint": int(checkpoint_id), "last_epoch": self._last_epoch,
                    "staged": [dict(f) for f in files]}

    # -- commit ------------------------------------------------------------------------
    def commit(self, handle: Mapping[str, Any]) -> None:
        files, _ = _validate_handle(handle)
        with self._commit_lock:
            self._publish(files, handle.get("checkpoint"), verify_sha256=False)
            self._forget_staging(int(handle["last_epoch"]))

    def recover(self, handle: Mapping[str, Any] | None) -> None:
        """Re-run the restored checkpoint's commit, withdraw committed output of epochs
        after it, delete every file nobody will commit. Raises CorruptCheckpointError
        (naming the file) if a file of the restored checkpoint is missing or corrupt."""
        with self._commit_lock:
            self._state = self._log.load()
            last = -1
            if handle:
                files, last = _validate_handle(handle)
                self._publish(files, handle.get("checkpoint"), verify_sha256=self._storage.is_local)
            self._withdraw_after(last)
            self._storage.rm(self._abs(STAGING), recursive=True)
        with self._lock:
            self._staged.clear()
            self._last_epoch = last

    def _publish(self, files: list[dict[str, Any]], checkpoint: Any, verify_sha256: bool) -> None:
        state = self._current_state()
        listed = self._listed(state)
        new = [f for f in files if _published(f["path"]) not in listed]
        # Every file is checked before any is moved: a checkpoint refused as corrupt must
        # leave nothing in the output a directory reader would see.
        to_move = [f for f in new if self._check_file(f, checkpoint, verify_sha256)]
        for f in to_move:
            self._move_file(f)
        if new and self._storage.is_local:
            fsync_dir(self.root)
        entries = [entry(self._log.uri(_published(f["path"])), f["size"]) for f in new]
        for attempt in range(5):
            if not entries:
                break
            try:
                self._state = self._log.append(state, entries)
                log.info("sink %s: committed %d file(s) of checkpoint %s as output log batch %d",
                         self.name, len(entries), checkpoint, self._state.latest)
                break
            except FileExistsError:
                # Another writer took that batch id, or an earlier attempt of ours whose
                # reply was lost did: reload and add only what is still missing.
                state = self._state = self._log.load()
                listed = self._listed(state)
                entries = [e for e in entries if self._log.relative(e["path"]) not in listed]
            except Exception:
                self._state = None  # the batch may or may not exist: reload next time
                raise
        else:
            raise CorruptCheckpointError(f"sink {self.name}: could not add a batch to {self._log.dir}: "
                                         f"its batch ids keep being taken by another writer")

    def _check_file(self, f: dict[str, Any], checkpoint: Any, verify_sha256: bool) -> bool:
        """True if `f` is staged intact and still to be published, False if it was published
        before; raises CorruptCheckpointError (naming it) if it is neither."""
        src, dst = self._abs(f["path"]), self._abs(_published(f["path"]))
        fs = self._storage
        published = fs.exists(dst)
        if published and self._verifies(dst, f, verify_sha256):
            return False  # published before (a retried commit, or recovery re-running it)
        if not fs.exists(src):
            state = "its published copy " + dst + " does not match its handle" if published else \
                "it was never published to " + dst
            raise CorruptCheckpointError(
                f"sink {self.name}: output file {src} of checkpoint {checkpoint} (epoch {f['epoch']}, "
                f"{f['rows']} rows) is missing and {state}. Was the output directory changed by hand? "
                f"Restoring an older checkpoint produces its rows again")
        if not self._verifies(src, f, verify_sha256):
            raise CorruptCheckpointError(
                f"sink {self.name}: staged output file {src} of checkpoint {checkpoint} does not match its "
                f"handle (expected {f['size']} bytes, sha256 {f['sha256']}); it is not published")
        return True

    def _move_file(self, f: dict[str, Any]) -> None:
        src, dst = self._abs(f["path"]), self._abs(_published(f["path"]))
        fs = self._storage
        if fs.is_local:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.replace(src, dst)
            fsync_dir(os.path.dirname(dst))
        else:
            try:
                fs.fs.copy(src, dst)  # server-side copy; the object appears whole or not at all
            except Exception as e:
                raise StorageError(f"sink {self.name}: copying {src} to {dst} failed: {type(e).__name__}: {e}") from e
            finally:
                fs.fs.invalidate_cache(dst)

    def _verifies(self, path: str, f: dict[str, Any], verify_sha256: bool) -> bool:
        if self._storage.size(path) != f["size"]:
            return False
        return not verify_sha256 or self._storage.sha256(path) == f["sha256"]

    def _withdraw_after(self, last_epoch: int) -> None:
        """Output of epochs after `last_epoch` belongs to checkpoints after the restored one
        (a restore that fell back past a corrupt checkpoint, or a fresh start): take it
        out of the log, then delete its files and any published file the log omits."""
        state = self._current_state()
        keep, drop = [], []
        for e in state.entries:
            epoch = _epoch_of(self._log.relative(e["path"]))
            (drop if epoch is not None and epoch > last_epoch else keep).append(e)
        if drop:
            log.warning("sink %s: withdrawing %d committed file(s) of epochs after %d: the restored checkpoint "
                        "is older than the output (restore fell back past a corrupt checkpoint); those epochs "
                        "are produced again", self.name, len(drop), last_epoch)
            self._state = state = self._log.rewrite(state, keep)
        listed = self._listed(state)
        for name in self._storage.ls(self.root):
            m = _EPOCH_DIR.match(name)
            if not m or int(m.group(1)) <= last_epoch:
                continue
            directory = self._abs(name)
            for file in self._storage.ls(directory):
                relative = f"{name}/{file}"
                if _PUBLISHED.match(relative) and relative not in listed:
                    self._storage.rm(self._abs(relative))
            if self._storage.is_local and not self._storage.ls(directory):
                try:
                    os.rmdir(directory)
                except OSError:
                    pass

    def _forget_staging(self, last_epoch: int) -> None:
        """After a commit covering epochs up to `last_epoch`: drop them from the staged set
        and delete what is left of their staging directories (losing task attempts; on
        object stores the copied originals). Best effort: `recover` empties it anyway."""
        with self._lock:
            for path in [p for p, f in self._staged.items() if f["epoch"] <= last_epoch]:
                del self._staged[path]
        try:
            for name in self._storage.ls(self._abs(STAGING)):
                m = _EPOCH_DIR.match(name)
                if m and int(m.group(1)) <= last_epoch:
                    self._storage.rm(self._abs(f"{STAGING}/{name}"), recursive=True)
        except Exception as e:
            log.warning("sink %s: could not clean up staged files up to epoch %d: %s", self.name, last_epoch, e)

    # -- reading the commit log (never the data) ---------------------------------------
    def _current_state(self) -> LogState:
        if self._state is None:
            self._state = self._log.load()
        return self._state

    def _listed(self, state: LogState) -> set[str]:
        return {r for e in state.entries if (r := self._log.relative(e["path"])) is not None}

    def committed_files(self) -> list[str]:
        """The committed data files (fsspec paths), as Spark reads them."""
        state = self._log.load()
        return sorted(self._abs(r) for r in self._listed(state))

    def committed_epochs(self) -> list[int]:
        if self._log.exists():
            return sorted({e for r in self._listed(self._log.load()) if (e := _epoch_of(r)) is not None})
        # An output directory written without the log (an older sparkpoint): its epoch dirs.
        return sorted(int(m.group(1)) for n in self._storage.ls(self.root) if (m := _EPOCH_DIR.match(n)))


def read_committed(path: str, storage_options: dict[str, Any] | None = None) -> pa.Table:
    """The committed output as one Arrow table (with the `epoch` column), read without
    Spark by following the same log Spark follows. For tests and small outputs."""
    import pyarrow.dataset as ds

    sink = ParquetSink(path, storage_options=storage_options)
    files = sink.committed_files()
    if not files:
        return pa.table({})
    dataset = ds.dataset(files, filesystem=sink._storage.fs, format="parquet",
                         partitioning=ds.partitioning(pa.schema([("epoch", pa.int32())]), flavor="hive"),
                         partition_base_dir=sink.root)
    return dataset.to_table()


# -- handles are untrusted when read back from a checkpoint --------------------------------
def _published(staged_path: str) -> str:
    return staged_path[len(STAGING) + 1:]


def _epoch_of(relative: str | None) -> int | None:
    m = _PUBLISHED.match(relative) if relative else None
    return int(m.group(1)) if m else None


def _validate_file(f: Any, where: str) -> dict[str, Any]:
    def bad(why: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"parquet sink {where}: {why}: {f!r:.300}")

    if not isinstance(f, Mapping):
        raise bad("not an object")
    path = f.get("path")
    m = _STAGED.match(path) if isinstance(path, str) else None
    if not m:
        raise bad("path is not a staged file of this sink (_staging/epoch=<e>/part-<n>-<uuid>.parquet)")
    ints = {k: f.get(k) for k in ("epoch", "part", "size", "rows")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints.values()):
        raise bad("epoch, part, size and rows must be non-negative integers")
    if int(m.group(1)) != ints["epoch"] or int(m.group(2)) != ints["part"]:
        raise bad("path does not match epoch and part")
    if not isinstance(f.get("sha256"), str) or not _SHA256.match(f["sha256"]):
        raise bad("sha256 is not a hex SHA-256")
    return {**ints, "path": path, "sha256": f["sha256"]}


def _validate_handle(handle: Mapping[str, Any]) -> tuple[list[dict[str, Any]], int]:
    if not isinstance(handle, Mapping) or handle.get("v") != HANDLE_VERSION or \
            not isinstance(handle.get("staged"), list) or not isinstance(handle.get("last_epoch"), int):
        raise CorruptCheckpointError(f"parquet sink handle is not one this version writes "
                                     f"(v={HANDLE_VERSION}, files, last_epoch): {handle!r:.300}")
    where = f"checkpoint {handle.get('checkpoint')} file"
    return [_validate_file(f, where) for f in handle["staged"]], int(handle["last_epoch"])
