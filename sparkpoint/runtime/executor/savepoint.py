"""The executor's part of a savepoint: copy the state files of the subtask it runs
into the savepoint directory, in the barrier epoch (storage/savepoints.py has the
layout). State files go storage to storage through the executor, never the driver."""

from __future__ import annotations

import os
import posixpath
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterable

from sparkpoint.state.snapshot import SnapshotFile, snapshot_files
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout


@dataclass(frozen=True)
class SavepointTarget:
    url: str
    options: dict[str, Any] = field(default_factory=dict)


def copy_state_files(files: Iterable[SnapshotFile], fs: StorageFS, layout: JobLayout,
                     target: SavepointTarget) -> dict[str, int]:
    """Copy each file to `<savepoint>/<its job-relative path>`; a copy already there at
    the right size (a re-run task) is kept."""
    dest = StorageFS.from_url(target.url, target.options)
    copied = skipped = size = 0
    with tempfile.TemporaryDirectory(prefix="sparkpoint-savepoint-") as tmp:
        for f in {f.path: f for f in files}.values():
            to = posixpath.join(dest.root, f.path)
            if dest.exists(to) and dest.size(to) == f.size:
                skipped += 1
                continue
            local = os.path.join(tmp, "file")
            fs.get_file(layout.join(f.path), local)
            dest.put_file(local, to)
            os.unlink(local)
            copied += 1
            size += f.size
    return {"copied": copied, "kept": skipped, "bytes": size}


def lineage_files(lineage, entry, snapshot: dict | None) -> list[SnapshotFile]:
    """Every file the subtask's lineage can reference after this epoch: what it had,
    this epoch's change log, and a snapshot uploaded in this epoch."""
    files = list(lineage.files())
    if entry is not None:
        files.append(entry.file)
    if snapshot is not None:
        files.extend(snapshot_files(snapshot))
    return files
