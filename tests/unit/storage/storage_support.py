"""Shared helpers for the storage tests: a manual clock and checkpoint builders."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.storage.checkpoint_storage import FsCheckpointStorage
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout


@dataclass
class ManualClock:
    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def local_job(directory: Path, job: str = "job") -> tuple[StorageFS, JobLayout]:
    fs = StorageFS.from_url(str(directory))
    return fs, JobLayout(f"{fs.root}/{job}")


def put(fs: StorageFS, layout: JobLayout, rel: str, data: bytes) -> dict:
    """Write a file into storage and return its handle file entry."""
    fs.write_atomic(layout.join(rel), data)
    return {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "shared": rel.startswith("shared/"), "name": rel.rsplit("/", 1)[-1]}


def complete_checkpoint(storage: FsCheckpointStorage, checkpoint_id: int, files: dict[str, bytes],
                        ts_ms: int = 1_000) -> CompletedCheckpointData:
    """Run a checkpoint through storage: claim the location, write files, commit metadata.
    `files` maps job-relative paths to content; "chk-{id}/..." paths are exclusive."""
    location = storage.initialize_location(checkpoint_id)
    entries = [put(storage.fs, storage.layout, rel.format(id=checkpoint_id), data)
               for rel, data in files.items()]
    data = CompletedCheckpointData(
        job_name=storage.job_name, checkpoint_id=checkpoint_id, trigger_timestamp_ms=ts_ms,
        completion_timestamp_ms=ts_ms + 5,
        handles={"state:counts/0": {"kind": "rocksdb", "files": entries}, "source:gen": {"offset": 7}})
    storage.commit_metadata(location, data)
    return data
