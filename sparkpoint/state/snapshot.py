"""State snapshot handles: how one participant's RocksDB checkpoint is described in
`_metadata`, where its files live in checkpoint storage, and how they are verified.

A handle is plain JSON:

    {"format": "sparkpoint/rocksdb-snapshot", "version": 1,
     "checkpoint_id": 7, "participant": "counts/0",
     "files": [{"name": "000009.sst", "path": "shared/counts/0/1f2e3d4c5b6a7988-000009.sst",
                "size": 1264910, "sha256": "1f2e...", "shared": true},
               {"name": "MANIFEST-000005", "path": "chk-7/counts/0/MANIFEST-000005",
                "size": 379, "sha256": "...", "shared": false}, ...]}

Immutable RocksDB files (*.sst, *.blob) are content addressed under `shared/`, so an
incremental checkpoint uploads only SSTs it has not seen before, and two DB lineages
that reuse a file name never clash. Everything else (MANIFEST, CURRENT, OPTIONS, WAL,
rocksdict's config) belongs to the one checkpoint, under `chk-<id>/`.

Why explicit checksums: RocksDB does not verify data blocks when it opens a DB, and a
full scan can stop silently at a corrupt block (seed 003, "Bad table magic number").
So no file is handed to RocksDB before its size and sha256 match the handle.

Upload lives in `sparkpoint.state.upload`, restore in `sparkpoint.state.restore`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Mapping

from sparkpoint.errors import CorruptSnapshotError, SnapshotCancelled
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import SHARED_DIR, JobLayout, checkpoint_dir_name

HANDLE_FORMAT = "sparkpoint/rocksdb-snapshot"
HANDLE_VERSION = 1

# RocksDB never rewrites these once written; everything else may change between
# checkpoints even under the same name (MANIFEST grows, CURRENT is replaced).
IMMUTABLE_SUFFIXES = (".sst", ".blob")

_HASH_CHUNK = 1 << 20


def is_immutable(name: str) -> bool:
    return name.endswith(IMMUTABLE_SUFFIXES)


@dataclass(frozen=True)
class SnapshotFile:
    """One file of a snapshot: `path` is relative to the job root."""

    name: str
    path: str
    size: int
    sha256: str
    shared: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "size": self.size,
                "sha256": self.sha256, "shared": self.shared}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], checkpoint_id: Any) -> "SnapshotFile":
        try:
            f = cls(name=str(raw["name"]), path=str(raw["path"]), size=int(raw["size"]),
                    sha256=str(raw["sha256"]), shared=bool(raw["shared"]))
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptSnapshotError(
                f"checkpoint {checkpoint_id}: a state file entry is malformed ({raw!r}: {e}); "
                "the metadata is damaged or foreign, restore from another checkpoint") from e
        # The name becomes a local file name and the path a storage path: a handle
        # must not be able to point outside the restore directory or the job root.
        if not _is_plain_name(f.name) or not _is_relative_path(f.path) or f.size < 0:
            raise CorruptSnapshotError(
                f"checkpoint {checkpoint_id}: state file entry {raw!r} has an unsafe name or path; "
                "the metadata is damaged or foreign, restore from another checkpoint")
        return f


def _is_plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


def _is_relative_path(path: str) -> bool:
    parts = path.split("/")
    return not path.startswith("/") and all(_is_plain_name(p) for p in parts)


def validate_participant_path(participant_path: str) -> str:
    """`participant_path` is a '/'-separated relative path such as "counts/0"."""
    if not _is_relative_path(participant_path):
        raise ValueError(
            f"participant path {participant_path!r} must be relative, '/'-separated, without '.' "
            "or '..' segments (e.g. 'counts/0')")
    return participant_path


def shared_file_path(participant_path: str, name: str, sha256: str) -> str:
    return "/".join([SHARED_DIR, participant_path, f"{sha256[:16]}-{name}"])


def exclusive_file_path(checkpoint_id: int, participant_path: str, name: str) -> str:
    return "/".join([checkpoint_dir_name(checkpoint_id), participant_path, name])


def make_handle(checkpoint_id: int, participant_path: str,
                files: Iterable[SnapshotFile]) -> dict[str, Any]:
    return {"format": HANDLE_FORMAT, "version": HANDLE_VERSION,
            "checkpoint_id": checkpoint_id, "participant": participant_path,
            "files": [f.to_json() for f in files]}


def snapshot_files(handle: Mapping[str, Any]) -> list[SnapshotFile]:
    """The handle's files, validated. Raises `CorruptSnapshotError` if the handle is
    not a snapshot handle this version understands."""
    checkpoint_id = handle.get("checkpoint_id", "?")
    if handle.get("format") != HANDLE_FORMAT or handle.get("version") != HANDLE_VERSION:
        raise CorruptSnapshotError(
            f"checkpoint {checkpoint_id}: state handle has format {handle.get('format')!r} "
            f"version {handle.get('version')!r}, expected {HANDLE_FORMAT!r} version {HANDLE_VERSION}; "
            "it was written by another program or a newer sparkpoint")
    raw_files = handle.get("files")
    if not isinstance(raw_files, list):
        raise CorruptSnapshotError(
            f"checkpoint {checkpoint_id}: state handle has no 'files' list; the metadata is damaged")
    return [SnapshotFile.from_json(raw, checkpoint_id) for raw in raw_files]


def referenced_files(handle: Mapping[str, Any]) -> set[str]:
    """Paths (relative to the job root) of every file `handle` needs: what the garbage
    collector must keep while the checkpoint is retained."""
    return {f.path for f in snapshot_files(handle)}


class SnapshotHandleIndex:
    """Shared files known to be fully uploaded, from handles of checkpoints that are
    still retained (or in flight from this run). An upload skips these without asking
    storage. Build it only from handles whose files the garbage collector still keeps."""

    def __init__(self) -> None:
        self._sizes: dict[str, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_handles(cls, handles: Iterable[Mapping[str, Any]]) -> "SnapshotHandleIndex":
        index = cls()
        for handle in handles:
            index.add(handle)
        return index

    def add(self, handle: Mapping[str, Any]) -> None:
        with self._lock:
            for f in snapshot_files(handle):
                if f.shared:
                    self._sizes[f.path] = f.size

    def has(self, path: str, size: int) -> bool:
        with self._lock:
            return self._sizes.get(path) == size


# -- verification ------------------------------------------------------------------

class ProblemKind(Enum):
    MISSING = "missing"
    SIZE_MISMATCH = "size mismatch"
    CHECKSUM_MISMATCH = "checksum mismatch"


@dataclass(frozen=True)
class Problem:
    """One file that does not match its handle entry. `location` is where it was
    checked: a storage path or a local path."""

    file: SnapshotFile
    kind: ProblemKind
    location: str
    actual_size: int | None = None
    actual_sha256: str | None = None

    def describe(self) -> str:
        if self.kind is ProblemKind.MISSING:
            return f"{self.file.name} ({self.location}): missing"
        if self.kind is ProblemKind.SIZE_MISMATCH:
            return (f"{self.file.name} ({self.location}): size mismatch, "
                    f"expected {self.file.size} bytes, found {self.actual_size}")
        return (f"{self.file.name} ({self.location}): checksum mismatch, "
                f"expected sha256 {self.file.sha256[:16]}…, found {(self.actual_sha256 or '')[:16]}…")


def sha256_file(path: str, cancel: threading.Event | None = None) -> str:
    """Streamed sha256 of a local file. Checks `cancel` between chunks so an aborted
    checkpoint does not keep hashing a large SST."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            if cancel is not None and cancel.is_set():
                raise SnapshotCancelled(f"upload cancelled while hashing {path}")
            digest.update(chunk)
    return digest.hexdigest()


def check_local_file(local_path: str, expected: SnapshotFile,
                     location: str | None = None) -> Problem | None:
    """None if the local file has the expected size and sha256, else the problem."""
    where = location or local_path
    try:
        size = os.stat(local_path).st_size
    except FileNotFoundError:
        return Problem(expected, ProblemKind.MISSING, where)
    if size != expected.size:
        return Problem(expected, ProblemKind.SIZE_MISMATCH, where, actual_size=size)
    actual = sha256_file(local_path)
    if actual != expected.sha256:
        return Problem(expected, ProblemKind.CHECKSUM_MISMATCH, where,
                       actual_size=size, actual_sha256=actual)
    return None


def verify_snapshot(handle: Mapping[str, Any], fs: StorageFS, layout: JobLayout) -> list[Problem]:
    """Check every file of `handle` in checkpoint storage: present, right size, right
    sha256. Returns the problems (empty: the snapshot restores). Downloads each file
    to a temporary directory to hash it; raises `StorageError` on I/O failure."""
    problems: list[Problem] = []
    with tempfile.TemporaryDirectory(prefix="sparkpoint-verify-") as scratch:
        for f in snapshot_files(handle):
            remote = layout.join(f.path)
            try:
                size = fs.size(remote)
            except FileNotFoundError:
                problems.append(Problem(f, ProblemKind.MISSING, remote))
                continue
            if size != f.size:
                problems.append(Problem(f, ProblemKind.SIZE_MISMATCH, remote, actual_size=size))
                continue
            local = os.path.join(scratch, f.name)
            fs.get_file(remote, local)
            problem = check_local_file(local, f, location=remote)
            os.unlink(local)
            if problem is not None:
                problems.append(problem)
    return problems


def corrupt_snapshot_error(handle: Mapping[str, Any], problems: list[Problem]) -> CorruptSnapshotError:
    checkpoint_id = handle.get("checkpoint_id", "?")
    participant = handle.get("participant", "?")
    listed = "; ".join(p.describe() for p in problems)
    return CorruptSnapshotError(
        f"checkpoint {checkpoint_id}, state {participant!r}: {len(problems)} file(s) in checkpoint "
        f"storage fail verification: {listed}. This checkpoint cannot be restored; restore from an "
        f"older retained checkpoint (`sparkpoint checkpoints verify` lists which ones verify).",
        problems=tuple(problems))
