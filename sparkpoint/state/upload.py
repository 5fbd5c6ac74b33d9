"""The asynchronous part of a state snapshot: upload a local RocksDB checkpoint
(`rocksdict.Checkpoint(db).create_checkpoint(dir)`, the synchronous part) to
checkpoint storage, incrementally, and return its handle.

Runs on a background thread of the driver while the next epochs run. Per file:
  1. check `cancel` (the checkpoint may have been aborted: stop writing, seed 000),
  2. sha256 it (immutable files: cached by name/size/inode/mtime, so an SST that
     sits unchanged in many checkpoints is hashed once),
  3. immutable file -> `shared/<participant>/<sha256[:16]>-<name>`: skipped if a
     retained checkpoint already references it or storage already holds it at the
     right size; otherwise uploaded. Content addressing makes a concurrent identical
     upload harmless.
     mutable file -> `chk-<id>/<participant>/<name>`: always uploaded.
A crash or cancel at any point leaves only files no `_metadata` references yet;
checkpoint discard and the garbage collector remove them.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from sparkpoint.errors import SnapshotCancelled
from sparkpoint.state.snapshot import (
    SnapshotFile,
    SnapshotHandleIndex,
    exclusive_file_path,
    is_immutable,
    make_handle,
    sha256_file,
    shared_file_path,
    validate_participant_path,
)
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout


class FileHashCache:
    """sha256 of immutable local files, keyed by (name, size, device, inode, mtime).

    A RocksDB checkpoint hard-links SSTs, so the same SST in successive checkpoints
    keeps its inode and mtime: it hits. A rewritten file gets a new inode or mtime:
    it misses. Shared by all uploads of one process; thread-safe; bounded (LRU)."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self._entries: OrderedDict[tuple[Any, ...], str] = OrderedDict()
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def sha256(self, path: str, cancel: threading.Event | None = None) -> str:
        st = os.stat(path)
        key = (os.path.basename(path), st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns)
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return cached
        digest = sha256_file(path, cancel)
        with self._lock:
            self.misses += 1
            self._entries[key] = digest
            if len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        return digest


@dataclass(frozen=True)
class UploadMetrics:
    files: int
    files_uploaded: int
    files_reused: int
    bytes_uploaded: int
    bytes_reused: int
    duration_s: float

    def to_json(self) -> dict[str, Any]:
        return {"files": self.files, "files_uploaded": self.files_uploaded,
                "files_reused": self.files_reused, "bytes_uploaded": self.bytes_uploaded,
                "bytes_reused": self.bytes_reused, "duration_s": self.duration_s}


@dataclass(frozen=True)
class UploadResult:
    handle: dict[str, Any]  # JSON-compatible: goes into `_metadata` as is
    metrics: UploadMetrics
    reused: tuple[str, ...]  # names of shared files that were not uploaded again


def upload_snapshot(
    local_checkpoint_dir: str,
    fs: StorageFS,
    layout: JobLayout,
    checkpoint_id: int,
    participant_path: str,
    *,
    previous: SnapshotHandleIndex | None = None,
    cancel: threading.Event | None = None,
    hash_cache: FileHashCache | None = None,
    retain_local: bool = True,
    all_shared: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> UploadResult:
    """Upload the RocksDB checkpoint in `local_checkpoint_dir` as checkpoint
    `checkpoint_id` of participant `participant_path` (e.g. "counts/0").

    Raises `SnapshotCancelled` as soon as `cancel` is set (checked before every file
    and while hashing); after it raises nothing more is written. Raises `StorageError`
    on I/O failure (the runtime declines the checkpoint; the job keeps running).
    `retain_local=False` deletes `local_checkpoint_dir` after a successful upload;
    keep it (the default) to serve as the local recovery copy. `all_shared=True` puts
    every file (MANIFEST, CURRENT, ... too) content addressed under `shared/`: a
    snapshot that is not owned by one checkpoint (a change-log base, referenced by
    every checkpoint until the next one)."""
    validate_participant_path(participant_path)
    started = clock()
    cache = hash_cache if hash_cache is not None else FileHashCache()
    made_dirs: set[str] = set()
    files: list[SnapshotFile] = []
    reused: list[str] = []
    bytes_uploaded = bytes_reused = 0

    for name in _checkpoint_file_names(local_checkpoint_dir):
        _raise_if_cancelled(cancel, checkpoint_id, participant_path)
        local = os.path.join(local_checkpoint_dir, name)
        size = os.stat(local).st_size
        shared = all_shared or is_immutable(name)
        try:
            # Mutable files are small and change under the same name: never cached.
            digest = cache.sha256(local, cancel) if is_immutable(name) else sha256_file(local, cancel)
        except SnapshotCancelled:
            _raise_if_cancelled(cancel, checkpoint_id, participant_path)
            raise
        if shared:
            path = shared_file_path(participant_path, name, digest)
            if _already_stored(fs, layout, previous, path, size):
                reused.append(name)
                bytes_reused += size
                files.append(SnapshotFile(name, path, size, digest, shared=True))
                continue
        else:
            path = exclusive_file_path(checkpoint_id, participant_path, name)
        _raise_if_cancelled(cancel, checkpoint_id, participant_path)
        _put(fs, layout, local, path, made_dirs)
        bytes_uploaded += size
        files.append(SnapshotFile(name, path, size, digest, shared=shared))

    if not retain_local:
        shutil.rmtree(local_checkpoint_dir, ignore_errors=True)
    metrics = UploadMetrics(
        files=len(files), files_uploaded=len(files) - len(reused), files_reused=len(reused),
        bytes_uploaded=bytes_uploaded, bytes_reused=bytes_reused, duration_s=clock() - started)
    return UploadResult(make_handle(checkpoint_id, participant_path, files), metrics, tuple(reused))


def _checkpoint_file_names(local_checkpoint_dir: str) -> list[str]:
    names = sorted(os.listdir(local_checkpoint_dir))
    nested = [n for n in names if not os.path.isfile(os.path.join(local_checkpoint_dir, n))]
    if nested:
        # A RocksDB checkpoint is flat; anything else means the wrong directory was passed.
        raise ValueError(
            f"{local_checkpoint_dir} is not a RocksDB checkpoint directory: it contains "
            f"non-files {nested}; pass the directory `Checkpoint.create_checkpoint` wrote")
    return names


def _already_stored(fs: StorageFS, layout: JobLayout, previous: SnapshotHandleIndex | None,
                    path: str, size: int) -> bool:
    if previous is not None and previous.has(path, size):
        return True
    remote = layout.join(path)
    # Size check: a crashed earlier upload can leave a truncated file at the content address.
    return fs.exists(remote) and fs.size(remote) == size


def _put(fs: StorageFS, layout: JobLayout, local: str, path: str, made_dirs: set[str]) -> None:
    remote = layout.join(path)
    parent = remote.rsplit("/", 1)[0]
    if parent not in made_dirs:
        fs.makedirs(parent)
        made_dirs.add(parent)
    fs.put_file(local, remote)


def _raise_if_cancelled(cancel: threading.Event | None, checkpoint_id: int, participant_path: str) -> None:
    if cancel is not None and cancel.is_set():
        raise SnapshotCancelled(
            f"upload of state {participant_path!r} for checkpoint {checkpoint_id} stopped: "
            "the checkpoint was aborted")
