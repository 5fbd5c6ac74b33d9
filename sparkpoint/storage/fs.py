"""Checkpoint storage over fsspec: the few operations checkpoints need, with the
atomicity each one promises spelled out per filesystem kind.

- `write_atomic`: readers see the old content or the new, never a torn file
  (local: temp file + rename; object stores: a single PUT is already atomic).
- `create_exclusive`: fails with `FileExistsError` if the path exists, atomically
  (local/NFS: O_CREAT|O_EXCL on a temp + link; object stores: conditional PUT).

Every I/O error surfaces as `StorageError` naming the path and the operation.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import uuid
from dataclasses import dataclass
from typing import Any

import fsspec

from sparkpoint.errors import StorageError


_HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileStat:
    """One file as storage reports it. `modified` is seconds since the epoch, or None
    when the backend does not say (age-based cleanup then treats the file as young)."""

    path: str
    size: int
    modified: float | None


def _modified_time(info: dict[str, Any]) -> float | None:
    # Backends name it differently: local "mtime", s3 "LastModified", memory "created".
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, _dt.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=_dt.timezone.utc)
            return value.timestamp()
    return None


def _makedirs(directory: str) -> None:
    """mkdir -p that reports a path blocked by a file as a storage failure (an unreachable
    checkpoint directory), not as the FileExistsError that means "lost an exclusive create"."""
    try:
        os.makedirs(directory, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
        raise StorageError(f"cannot create directory {directory}: {e}") from e


def fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not supported here (e.g. some network filesystems); the data itself is synced
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class StorageFS:
    def __init__(self, fs: fsspec.AbstractFileSystem, root: str):
        self.fs = fs
        self.root = root.rstrip("/")

    @classmethod
    def from_url(cls, url: str, storage_options: dict[str, Any] | None = None) -> "StorageFS":
        fs, _, paths = fsspec.get_fs_token_paths(url, storage_options=storage_options or {})
        return cls(fs, paths[0])

    @property
    def is_local(self) -> bool:
        return "file" in self._protocols

    @property
    def _protocols(self) -> tuple[str, ...]:
        protocol = self.fs.protocol
        return tuple(protocol) if isinstance(protocol, (tuple, list)) else (protocol,)

    # -- reads -------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        def run() -> bool:
            # Another process (a second deployment, a crashed run) may have changed
            # storage since fsspec cached a listing; decisions here must see it.
            self.fs.invalidate_cache(path)
            return bool(self.fs.exists(path))
        return self._io("exists", path, run)

    def read_bytes(self, path: str) -> bytes:
        return self._io("read", path, lambda: self.fs.cat_file(path))

    def ls(self, path: str) -> list[str]:
        """Entry names (not full paths) directly under `path`; [] if it does not exist."""
        def run() -> list[str]:
            self.fs.invalidate_cache(path)
            if not self.fs.exists(path):
                return []
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path, detail=False))
        return self._io("list", path, run)

    def size(self, path: str) -> int:
        return self.stat(path).size

    def stat(self, path: str) -> FileStat:
        def run() -> FileStat:
            self.fs.invalidate_cache(path)
            info = self.fs.info(path)
            return FileStat(path, int(info.get("size") or 0), _modified_time(info))
        return self._io("stat", path, run)

    def find(self, path: str) -> list[FileStat]:
        """Every file below `path` (recursively), sorted by path; [] if it does not exist."""
        def run() -> list[FileStat]:
            self.fs.invalidate_cache(path)
            if not self.fs.exists(path):
                return []
            found = self.fs.find(path, detail=True)
            return sorted(
                (FileStat(self._full(name), int(info.get("size") or 0), _modified_time(info))
                 for name, info in found.items() if info.get("type", "file") != "directory"),
                key=lambda f: f.path,
            )
        return self._io("list", path, run)

    def sha256(self, path: str) -> str:
        def run() -> str:
            digest = hashlib.sha256()
            with self.fs.open(path, "rb") as f:
                while chunk := f.read(_HASH_CHUNK):
                    digest.update(chunk)
            return digest.hexdigest()
        return self._io("read", path, run)

    def get_file(self, path: str, local_path: str) -> None:
        self._io("download", path, lambda: self.fs.get_file(path, local_path))

    # -- writes ------------------------------------------------------------------
    def makedirs(self, path: str) -> None:
        self._io("mkdir", path, lambda: self.fs.makedirs(path, exist_ok=True))

    def put_file(self, local_path: str, path: str) -> None:
        """Upload durably and atomically: a file present at `path` is complete (so a
        content-addressed file found at the right size was written whole). Local/NFS:
        temp file, fsync, rename, fsync of the directory; object stores: one PUT (or a
        multipart upload, which appears only when completed); memory://: the whole bytes
        in one step (its put_file publishes an empty file first and then fills it)."""
        def run() -> None:
            if "memory" in self._protocols:
                with open(local_path, "rb") as src:
                    self.fs.pipe_file(path, src.read())
                return
            if not self.is_local:
                self.fs.put_file(local_path, path)
                return
            parent = os.path.dirname(path)
            _makedirs(parent)
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            try:
                with open(local_path, "rb") as src, open(tmp, "wb") as dst:
                    while chunk := src.read(_HASH_CHUNK):
                        dst.write(chunk)
                    dst.flush()
                    os.fsync(dst.fileno())
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
            fsync_dir(parent)
        self._io("upload", path, run)

    def write_atomic(self, path: str, data: bytes) -> None:
        def run() -> None:
            if self.is_local:
                parent = os.path.dirname(path)
                _makedirs(parent)
                tmp = f"{path}.tmp-{uuid.uuid4().hex}"
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
                fsync_dir(parent)  # the rename itself must survive a power cut
            else:
                self.fs.pipe_file(path, data)
        self._io("write", path, run)

    def create_exclusive(self, path: str, data: bytes) -> None:
        """Raises FileExistsError (not StorageError) if `path` exists."""
        if self.is_local:
            parent = os.path.dirname(path)
            try:
                _makedirs(parent)
                # Write the content in full under a private name, then link(2) it into
                # place: link fails atomically if the target exists (also on NFS), and a
                # reader never sees a half-written file.
                tmp = f"{path}.tmp-{uuid.uuid4().hex}"
                with open(tmp, "xb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    try:
                        os.link(tmp, path)
                    except FileExistsError:
                        # NFS may retransmit a link whose first reply was lost and then
                        # answer EEXIST for our own success: the link count tells (open(2)).
                        if os.stat(tmp).st_nlink != 2:
                            raise
                finally:
                    os.unlink(tmp)
                fsync_dir(parent)
            except FileExistsError:
                raise
            except OSError as e:
                raise StorageError(f"could not create {path}: {e}") from e
            return
        self._create_exclusive_remote(path, data)

    def _create_exclusive_remote(self, path: str, data: bytes) -> None:
        # Object stores: conditional write. Implemented per backend in storage/objectstore.py.
        from sparkpoint.storage.objectstore import create_exclusive_object

        create_exclusive_object(self.fs, path, data)

    def rm(self, path: str, recursive: bool = False) -> None:
        """Delete; a path that is already gone is not an error (deletes are retried)."""
        def run() -> None:
            self.fs.invalidate_cache(path)
            try:
                if self.fs.exists(path):
                    self.fs.rm(path, recursive=recursive)
            except FileNotFoundError:
                pass
        self._io("delete", path, run)

    def _full(self, name: str) -> str:
        # fsspec strips the protocol from listed names; local paths keep their leading "/".
        if self.is_local and not name.startswith("/"):
            return "/" + name
        return name

    # -----------------------------------------------------------------------------
    @staticmethod
    def _io(op: str, path: str, fn):
        try:
            return fn()
        except (FileExistsError, StorageError):
            raise
        except FileNotFoundError:
            raise
        except Exception as e:  # fsspec backends raise many types; name the operation and path
            raise StorageError(f"checkpoint storage {op} failed for {path}: {type(e).__name__}: {e}") from e
