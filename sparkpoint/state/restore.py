"""Restore one participant's RocksDB state from a snapshot handle, verified.

Per file of the handle:
  1. if the local recovery copy (`local_copy_dir`, the hard-link checkpoint this
     process made for that checkpoint id) has it with the recorded size and sha256,
     take it from there (hard link for immutable files, copy for the rest);
  2. otherwise download it from checkpoint storage and check size and sha256.
A corrupt or missing local file is only reported (seed 003: a corrupt local SST must
not kill the job); a corrupt or missing remote file makes the whole restore fail
with `CorruptSnapshotError`, so the caller can fall back to an older checkpoint.

Files are assembled in a private staging directory and moved to `target_dir` only
when every one verified, so RocksDB never sees a partial or unverified directory.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Mapping

from sparkpoint.state.snapshot import (
    Problem,
    ProblemKind,
    SnapshotFile,
    check_local_file,
    corrupt_snapshot_error,
    is_immutable,
    snapshot_files,
)
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout


class FileSource(Enum):
    LOCAL = "local"
    REMOTE = "remote"


@dataclass(frozen=True)
class RestoredFile:
    name: str
    size: int
    source: FileSource


@dataclass(frozen=True)
class RestoreReport:
    checkpoint_id: int
    participant: str
    target_dir: str
    files: tuple[RestoredFile, ...]
    # Local recovery-copy files that were missing or failed verification (fetched remotely).
    local_problems: tuple[Problem, ...]
    duration_s: float

    @property
    def from_local(self) -> set[str]:
        return {f.name for f in self.files if f.source is FileSource.LOCAL}

    @property
    def from_remote(self) -> set[str]:
        return {f.name for f in self.files if f.source is FileSource.REMOTE}

    @property
    def corrupt_local(self) -> set[str]:
        """Local files present but wrong (size or checksum): worth an alarm."""
        return {p.file.name for p in self.local_problems if p.kind is not ProblemKind.MISSING}

    @property
    def bytes_remote(self) -> int:
        return sum(f.size for f in self.files if f.source is FileSource.REMOTE)

    @property
    def bytes_local(self) -> int:
        return sum(f.size for f in self.files if f.source is FileSource.LOCAL)


def restore_snapshot(
    handle: Mapping[str, Any],
    fs: StorageFS,
    layout: JobLayout,
    target_dir: str,
    *,
    local_copy_dir: str | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RestoreReport:
    """Materialize the snapshot `handle` as a RocksDB directory at `target_dir`
    (which must not exist, or be empty).

    Raises `CorruptSnapshotError` (naming the files and the checkpoint) if a file
    that had to come from checkpoint storage is missing or fails its size/sha256
    check; `target_dir` is then left absent. Raises `StorageError` on I/O failure,
    `FileExistsError` if `target_dir` holds files."""
    started = clock()
    files = snapshot_files(handle)
    _require_free(target_dir)
    staging = f"{target_dir.rstrip(os.sep)}.restoring-{uuid.uuid4().hex[:12]}"
    os.makedirs(staging)
    try:
        restored: list[RestoredFile] = []
        local_problems: list[Problem] = []
        remote_problems: list[Problem] = []
        for f in files:
            staged = os.path.join(staging, f.name)
            if local_copy_dir is not None and os.path.isdir(local_copy_dir):
                problem = check_local_file(os.path.join(local_copy_dir, f.name), f)
                if problem is None:
                    _link_or_copy(os.path.join(local_copy_dir, f.name), staged, f)
                    restored.append(RestoredFile(f.name, f.size, FileSource.LOCAL))
                    continue
                local_problems.append(problem)
            problem = _download_verified(fs, layout, f, staged)
            if problem is not None:
                remote_problems.append(problem)
            else:
                restored.append(RestoredFile(f.name, f.size, FileSource.REMOTE))
        if remote_problems:
            raise corrupt_snapshot_error(handle, remote_problems)
        if os.path.isdir(target_dir):
            os.rmdir(target_dir)  # empty, checked above; rename needs the name free
        os.rename(staging, target_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return RestoreReport(
        checkpoint_id=int(handle.get("checkpoint_id", -1)), participant=str(handle.get("participant", "")),
        target_dir=target_dir, files=tuple(restored), local_problems=tuple(local_problems),
        duration_s=clock() - started)


def _require_free(target_dir: str) -> None:
    if os.path.isdir(target_dir) and os.listdir(target_dir):
        raise FileExistsError(
            f"cannot restore state into {target_dir}: it already holds files. Restore into a "
            "fresh directory, or delete the stale one first")
    if os.path.exists(target_dir) and not os.path.isdir(target_dir):
        raise FileExistsError(f"cannot restore state into {target_dir}: it is a file")


def _link_or_copy(source: str, dest: str, f: SnapshotFile) -> None:
    # RocksDB never rewrites an SST, so sharing its inode with the recovery copy is
    # safe (and instant). Mutable files (MANIFEST, WAL) are copied: RocksDB may append.
    if is_immutable(f.name):
        try:
            os.link(source, dest)
            return
        except OSError:
            pass  # different filesystem, or links unsupported: copy instead
    shutil.copyfile(source, dest)


def _download_verified(fs: StorageFS, layout: JobLayout, f: SnapshotFile, staged: str) -> Problem | None:
    remote = layout.join(f.path)
    try:
        fs.get_file(remote, staged)
    except FileNotFoundError:
        return Problem(f, ProblemKind.MISSING, remote)
    return check_local_file(staged, f, location=remote)
