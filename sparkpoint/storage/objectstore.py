"""Exclusive create ("write only if absent") on filesystems without link(2).

- S3 and S3-compatible stores: a conditional PUT with `If-None-Match: *`. The store
  answers 412 PreconditionFailed if the key exists; that check and the write are one
  atomic step on the server, so of two racing writers exactly one succeeds (AWS S3 since
  2024-08; MinIO; moto >= 5.0.x honours the header). A concurrent conditional write
  may be answered 409 ConditionalRequestConflict: retried, then decided by the 412 rule.
- fsspec's in-memory filesystem (tests): exclusive within this process, under a lock.
- Anything else (GCS, Azure, HTTP, ...): refused with StorageError, because a
  check-then-write would let two deployments overwrite each other's `_metadata` (seed 003).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import fsspec

from sparkpoint.errors import StorageError

_S3_PROTOCOLS = {"s3", "s3a"}
_CONFLICT_RETRIES = 5
_CONFLICT_BACKOFF_S = 0.05
_memory_lock = threading.Lock()


def _protocols(fs: fsspec.AbstractFileSystem) -> set[str]:
    protocol = fs.protocol
    return set(protocol) if isinstance(protocol, (tuple, list)) else {protocol}


def supports_exclusive_create(fs: fsspec.AbstractFileSystem) -> bool:
    return bool(_protocols(fs) & (_S3_PROTOCOLS | {"memory", "file", "local"}))


def create_exclusive_object(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Write `data` to `path` only if nothing is there. Raises FileExistsError if it
    exists, StorageError on any other failure or on a store without conditional writes."""
    protocols = _protocols(fs)
    if protocols & _S3_PROTOCOLS:
        _create_exclusive_s3(fs, path, data)
    elif "memory" in protocols:
        with _memory_lock:
            if fs.exists(path):
                raise FileExistsError(path)
            fs.pipe_file(path, data)
    else:
        raise StorageError(
            f"checkpoint storage {sorted(protocols)} cannot create {path} exclusively: only "
            f"local/NFS paths and S3-compatible object stores support it; without it two runs "
            f"could overwrite each other's checkpoint metadata. Use a local/NFS path or s3://")


def _create_exclusive_s3(fs: Any, path: str, data: bytes) -> None:
    for attempt in range(_CONFLICT_RETRIES):
        try:
            fs.pipe_file(path, data, mode="create")
            return
        except FileExistsError:
            raise
        except OSError as e:
            code = _s3_error_code(e)
            if code in ("PreconditionFailed", "412"):
                # Some S3-compatible stores omit the <Condition> element s3fs looks for.
                raise FileExistsError(path) from e
            if code in ("ConditionalRequestConflict", "409") and attempt + 1 < _CONFLICT_RETRIES:
                time.sleep(_CONFLICT_BACKOFF_S * (attempt + 1))
                continue
            raise StorageError(f"conditional create of {path} failed: {code or type(e).__name__}: {e}") from e
        finally:
            fs.invalidate_cache(path)
    raise StorageError(f"conditional create of {path} kept conflicting with a concurrent write; "
                       f"retry the operation")


def _s3_error_code(error: BaseException) -> str | None:
    cause = error.__cause__ or error.__context__
    response = getattr(cause, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return str(code) if code else (str(status) if status else None)
