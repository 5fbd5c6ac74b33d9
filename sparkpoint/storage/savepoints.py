"""Savepoints on storage: self-contained, relocatable copies of one checkpoint.

    <savepoint>/_metadata        the checkpoint's metadata, properties.savepoint = true
    <savepoint>/shared/...       every state file its handles reference, under the same
                                 relative path as in the job directory
    <savepoint>/sinks/<name>/...  a sink's staged output the savepoint has not published,
                                 if the sink stages beside the checkpoints (Kafka);
                                 written and read by the sink itself

Handles name files relative to the directory that holds them: the job directory for a
checkpoint, the savepoint directory itself for a savepoint. So copying a savepoint
directory anywhere (another disk, another bucket) keeps it restorable, and nothing in
it points into the checkpoints of the job that took it (Flink's canonical savepoint).

The state files are copied by the executors that hold the subtasks, in the barrier
epoch (runtime/executor); here the driver only checks that every referenced file
arrived, then writes `_metadata` last (exclusive create: its presence means complete).
Retention and garbage collection never look below `savepoints/` or a foreign target.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.errors import ConfigError, CorruptCheckpointError, MetadataExistsError
from sparkpoint.storage import metadata
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.handles import checkpoint_file_entries
from sparkpoint.storage.layout import METADATA_FILE, SAVEPOINTS_DIR, JobLayout


@dataclass(frozen=True)
class SavepointLocation:
    checkpoint_id: int
    url: str   # what a person passes to `--from-savepoint`
    path: str  # the same, as the target filesystem names it


def url_of(fs: StorageFS, path: str) -> str:
    """A path of `fs` as a user would write it: plain for local disks, with the scheme
    otherwise (s3://bucket/...)."""
    if fs.is_local:
        return path if path.startswith("/") else "/" + path
    return fs.fs.unstrip_protocol(path)


def target_fs(job_fs: StorageFS, layout: JobLayout, checkpoint_id: int, target: str | None,
              options: dict[str, Any] | None) -> tuple[StorageFS, SavepointLocation]:
    """Where a savepoint goes: `target` (a path or URL), else `<job>/savepoints/<name>`."""
    if target is None:
        path = layout.join(SAVEPOINTS_DIR, f"savepoint-{checkpoint_id}-{uuid.uuid4().hex[:6]}")
        fs = job_fs
    else:
        fs = StorageFS.from_url(target, options)
        path = fs.root
    return fs, SavepointLocation(checkpoint_id, url_of(fs, path), path)


def initialize(fs: StorageFS, location: SavepointLocation) -> None:
    if fs.exists(posixpath.join(location.path, METADATA_FILE)):
        raise MetadataExistsError(f"{location.url} already holds a savepoint; pick another target "
                                  "(an existing savepoint is never overwritten)")
    fs.makedirs(location.path)
    if fs.is_local:
        # A copy of all of the job's state: other users of the machine may not read it,
        # whatever the umask made of the files the executors copy into it.
        os.chmod(location.path, 0o700)


def commit(fs: StorageFS, location: SavepointLocation, data: CompletedCheckpointData) -> None:
    """Check that every state file the handles reference was copied, then write `_metadata`."""
    entries = checkpoint_file_entries(data.handles)
    present = {s.path: s.size for s in fs.find(location.path)} if entries else {}
    missing = []
    for e in entries:
        size = present.get(posixpath.join(location.path, e.path))
        if size is None or (e.size >= 0 and size != e.size):
            missing.append(e.path)
    if missing:
        raise CorruptCheckpointError(
            f"savepoint {location.url} is incomplete: {len(missing)} of {len(entries)} state files were not "
            f"copied (e.g. {missing[0]}); it is not completed, take another one")
    try:
        fs.create_exclusive(posixpath.join(location.path, METADATA_FILE), metadata.encode(data))
    except FileExistsError:
        raise MetadataExistsError(f"{location.url} already holds a savepoint; it was not overwritten") from None


def read(url: str, options: dict[str, Any] | None = None) -> tuple[CompletedCheckpointData, str, str]:
    """A savepoint (or a retained checkpoint directory `.../<job>/chk-<id>`) to start from:
    (its data, the URL its handles' paths are relative to split as (parent, name)).
    One clear ConfigError for anything that is not one."""
    fs = StorageFS.from_url(url, options)
    meta = posixpath.join(fs.root, METADATA_FILE)
    try:
        raw = fs.read_bytes(meta)
    except FileNotFoundError:
        raise ConfigError(f"{url} is not a savepoint or checkpoint: it has no {METADATA_FILE} (a savepoint "
                          "directory without it was not completed). Pass the path `sparkpoint savepoint` or "
                          "`sparkpoint stop --savepoint` printed, or a chk-<id> directory") from None
    data = metadata.decode(raw, None, meta)
    root = url.rstrip("/")
    if not data.properties.savepoint:  # a retained checkpoint: its files are beside it
        root = root.rsplit("/", 1)[0]
    parent, _, name = root.rpartition("/")
    return data, parent or "/", name
