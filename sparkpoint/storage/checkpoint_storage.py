"""`CheckpointStorage` over a filesystem (local, NFS, S3 via fsspec).

A checkpoint's life on storage, in order:

1. `initialize_location(id)`: exclusive create of `chk-<id>/_started`, which claims the id
   (a directory left by a crashed run, or a second writer, makes it fail with
   CheckpointIdCollision: the coordinator skips to a fresh id).
2. participants write exclusive files under `chk-<id>/` and new shared files under `shared/`.
3. `commit_metadata`: lease check, then exclusive create of `chk-<id>/_metadata`. Its
   presence is what "completed" means; a crash before it leaves an orphan for `gc`.
4. `discard_completed` when subsumed: `_metadata` goes first (so a half-deleted checkpoint
   is never restored from), then shared files nobody retained references, then the rest.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

from sparkpoint.checkpoint.interfaces import CheckpointLocation, CompletedCheckpointData, StateHandle
from sparkpoint.errors import (
    CheckpointIdCollision,
    ConfigError,
    CorruptCheckpointError,
    ForeignCheckpointError,
    MetadataExistsError,
)
from sparkpoint.storage import metadata, savepoints
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.handles import checkpoint_file_entries, referenced_paths
from sparkpoint.storage.ids import (
    DurableCheckpointIDCounter,
    highest_checkpoint_dir_id,
    list_checkpoint_ids,
)
from sparkpoint.storage.layout import (
    SHARED_DIR,
    JobLayout,
    valid_job_name,
)
from sparkpoint.storage.lease import JobLease

log = logging.getLogger(__name__)

STARTED_FORMAT = "sparkpoint-checkpoint-started"


@dataclass(frozen=True)
class FsCheckpointLocation:
    checkpoint_id: int
    path: str  # <job>/chk-<id>; participants write their exclusive files below it


class FsCheckpointStorage:
    """Implements `sparkpoint.checkpoint.interfaces.CheckpointStorage`.

    With a `lease`, `commit_metadata` refuses (LeaseLostError) once this run was fenced
    out; without one (tests, tools) no fencing is done."""

    def __init__(self, fs: StorageFS, layout: JobLayout, lease: JobLease | None = None,
                 clock: Callable[[], float] = time.time, options: dict[str, Any] | None = None):
        self.fs = fs
        self.layout = layout
        self.lease = lease
        self._clock = clock
        self.options = dict(options or {})  # for savepoint targets on another filesystem
        self._savepoint_fs: dict[int, StorageFS] = {}

    @property
    def job_name(self) -> str:
        return self.layout.job_name

    def initialize_location(self, checkpoint_id: int) -> FsCheckpointLocation:
        path = self.layout.checkpoint(checkpoint_id)
        if self.fs.exists(path):
            raise CheckpointIdCollision(self._collision_message(checkpoint_id))
        started = json.dumps({"format": STARTED_FORMAT, "job_name": self.job_name,
                              "checkpoint_id": checkpoint_id,
                              "run_id": self.lease.run_id if self.lease else None,
                              "created_ms": int(self._clock() * 1000)}).encode()
        self.fs.makedirs(path)
        try:
            # Exclusive: of two writers that passed the check above, one wins the id.
            self.fs.create_exclusive(self.layout.started(checkpoint_id), started)
        except FileExistsError:
            raise CheckpointIdCollision(self._collision_message(checkpoint_id)) from None
        return FsCheckpointLocation(checkpoint_id, path)

    def commit_metadata(self, location: CheckpointLocation, data: CompletedCheckpointData) -> None:
        if data.job_name != self.job_name or data.checkpoint_id != location.checkpoint_id:
            raise ValueError(f"metadata for job {data.job_name!r} checkpoint {data.checkpoint_id} "
                             f"does not belong at {location.path} (job {self.job_name!r})")
        raw = metadata.encode(data)
        if self.lease is not None:
            self.lease.check()  # fencing: a run that lost its lease must not commit
        if isinstance(location, savepoints.SavepointLocation):
            savepoints.commit(self._savepoint_fs.pop(location.checkpoint_id, self.fs), location, data)
            return
        try:
            self.fs.create_exclusive(self.layout.metadata(location.checkpoint_id), raw)
        except FileExistsError:
            raise MetadataExistsError(
                f"{self.layout.metadata(location.checkpoint_id)} already exists: another writer "
                f"completed checkpoint {location.checkpoint_id} of job {self.job_name!r}; this "
                f"checkpoint is not completed (the coordinator retries with a fresh id)") from None

    def initialize_savepoint_location(self, checkpoint_id: int, target: str | None):
        """A savepoint's directory (storage/savepoints.py); never under `chk-<id>/`."""
        fs, location = savepoints.target_fs(self.fs, self.layout, checkpoint_id, target, self.options)
        savepoints.initialize(fs, location)
        self._savepoint_fs[checkpoint_id] = fs
        return location

    def discard_location(self, checkpoint_id: int) -> None:
        self.fs.rm(self.layout.checkpoint(checkpoint_id), recursive=True)

    def discard_completed(self, checkpoint_id: int, still_referenced: Sequence[StateHandle]) -> None:
        """Delete checkpoint `checkpoint_id` and the shared files only it referenced.
        Raises LeaseLostError (deleting nothing) if this run was fenced out.

        `still_referenced` must include every handle that may still point at shared files:
        retained checkpoints *and* in-flight ones whose incremental snapshots reuse files."""
        if self.lease is not None:
            # A fenced run must not delete files the run that took over may restore from.
            self.lease.check()
        chk_dir = self.layout.checkpoint(checkpoint_id)
        meta_path = self.layout.metadata(checkpoint_id)
        own_paths: set[str] = set()
        has_metadata = True
        try:
            data = metadata.read_completed(self.fs, self.layout, checkpoint_id)
            has_metadata = data is not None
            if data is not None:
                own_paths = {e.path for e in checkpoint_file_entries(data.handles)}
        except (CorruptCheckpointError, ForeignCheckpointError) as e:
            log.warning("discarding chk-%d without reading its shared files (%s); startup gc "
                        "removes those it leaves unreferenced", checkpoint_id, e)
        if has_metadata:
            # Removing `_metadata` first makes the checkpoint "not completed" at once.
            self.fs.rm(meta_path)
        keep = referenced_paths(still_referenced)
        for rel in sorted(own_paths - keep):
            if rel.split("/", 1)[0] != SHARED_DIR:
                continue  # exclusive files go with the directory below
            try:
                self.fs.rm(self.layout.resolve(rel))
            except ValueError as e:
                log.warning("not deleting %r referenced by chk-%d: %s", rel, checkpoint_id, e)
        self.fs.rm(chk_dir, recursive=True)

    def discard_aborted(self, checkpoint_id: int, handles: Sequence[StateHandle],
                        still_referenced: Sequence[StateHandle]) -> None:
        """Delete an aborted checkpoint's directory and the shared files its acks named
        that nothing in `still_referenced` (retained, in-flight, live) needs. Called only
        once its writers stopped. Raises LeaseLostError (deleting nothing) if fenced."""
        if self.lease is not None:
            self.lease.check()
        keep = referenced_paths(still_referenced)
        for rel in sorted(referenced_paths(handles) - keep):
            if rel.split("/", 1)[0] != SHARED_DIR:
                continue
            try:
                self.fs.rm(self.layout.resolve(rel))
            except ValueError as e:
                log.warning("not deleting %r named by aborted chk-%d: %s", rel, checkpoint_id, e)
        self.fs.rm(self.layout.checkpoint(checkpoint_id), recursive=True)

    def load_completed(self) -> list[CompletedCheckpointData]:
        completed = []
        for checkpoint_id in self.checkpoint_ids():
            try:
                data = metadata.read_completed(self.fs, self.layout, checkpoint_id)
            except (CorruptCheckpointError, ForeignCheckpointError) as e:
                log.warning("skipping chk-%d: %s", checkpoint_id, e)
                continue
            if data is not None:
                completed.append(data)
        return completed

    def checkpoint_ids(self) -> list[int]:
        """Ids of every `chk-<id>` directory, completed or not, ascending."""
        return list_checkpoint_ids(self.fs, self.layout)

    def highest_checkpoint_id(self) -> int | None:
        """Highest `chk-<id>` directory present, completed or not; None if there is none
        (`SupportsHighestCheckpointId`)."""
        return highest_checkpoint_dir_id(self.fs, self.layout) or None

    def _collision_message(self, checkpoint_id: int) -> str:
        return (f"{self.layout.checkpoint(checkpoint_id)} already exists (left by a crashed run, "
                f"or another writer uses this job directory); checkpoint id {checkpoint_id} is "
                f"skipped")


class JobStorage(NamedTuple):
    fs: StorageFS
    layout: JobLayout
    lease: JobLease
    ids: DurableCheckpointIDCounter
    checkpoints: FsCheckpointStorage
    url: str

    def close(self, release_lease: bool = True) -> None:
        """On clean shutdown release the lease so the next run starts at once; after a
        fatal error keep it (it expires) so a restart loop cannot race a dying run."""
        self.ids.shutdown()
        if release_lease:
            self.lease.release()


def open_job_storage(url: str, job_name: str, storage_options: dict[str, Any] | None = None,
                     run_id: str | None = None, *, host: str | None = None, pid: int | None = None,
                     lease_ttl_s: float = 30.0, clock: Callable[[], float] = time.time,
                     wrap_fs: Callable[[StorageFS], StorageFS] | None = None) -> JobStorage:
    """Build the storage collaborators of one job under checkpoint root `url`.

    Nothing is acquired or written: the runtime then calls, in order,
    `lease.acquire()` (+ a LeaseKeeper), `gc.collect_garbage(...)`, `ids.start()`,
    `checkpoints.load_completed()`. `wrap_fs` wraps the filesystem (the runtime's fault
    rehearsal, sparkpoint.faults). Raises ConfigError for an invalid job name."""
    if not valid_job_name(job_name):
        raise ConfigError(f"job name {job_name!r} is invalid: use 1-128 characters from "
                          f"A-Z a-z 0-9 . _ -, starting with a letter or digit")
    fs = StorageFS.from_url(url, storage_options)
    if wrap_fs is not None:
        fs = wrap_fs(fs)
    layout = JobLayout(f"{fs.root}/{job_name}")
    lease = JobLease(fs, layout, run_id or _new_run_id(), host=host, pid=pid,
                     ttl_s=lease_ttl_s, clock=clock)
    return JobStorage(fs, layout, lease, DurableCheckpointIDCounter(fs, layout),
                      FsCheckpointStorage(fs, layout, lease, clock=clock, options=storage_options), url)


def _new_run_id() -> str:
    return uuid.uuid4().hex[:12]
