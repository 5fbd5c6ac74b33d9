"""A subtask's state on the executor that runs it: bring the local store to the
epoch the task needs (use it, catch up, or rebuild from storage), make each epoch's
changes durable, and upload snapshots when the driver asks.

Local layout under `state.local.dir` (on each executor's own disk):

    <job>-<cp>/<operator>/subtask-<i>/db              the RocksDB store (a cache of the lineage)
    <job>-<cp>/<operator>/subtask-<i>/snap-<epoch>/   hard-link copy of the last uploaded snapshot
    <job>-<cp>/<operator>/subtask-<i>/pending/        change logs storage did not take yet

`<cp>` names the job's checkpoint location (`job_local_root`): two runs of one job name
with different checkpoint directories never share local stores.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field

import pyarrow as pa

from sparkpoint.errors import CorruptSnapshotError, StaleStateError, StorageError
from sparkpoint.runtime.executor import kept_stores
from sparkpoint.runtime.executor.store_opening import EpochInput, How, LocalStore, decide
from sparkpoint.state.changelog import (
    NO_EPOCH,
    ChangelogFile,
    Lineage,
    changelog_path,
    decode_changes,
    encode_changes,
    state_participant_path,
)
from sparkpoint.state.keys import key_group_range
from sparkpoint.state.memory import StateMemory, WorkerMemory, worker_memory
from sparkpoint.state.snapshot import SnapshotFile, SnapshotHandleIndex, check_local_file
from sparkpoint.state.store import SubtaskStateStore
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout

log = logging.getLogger(__name__)


def job_local_root(local_state_dir: str, job_name: str, checkpoint_url: str) -> str:
    """The job's directory under `state.local.dir`: its name, and a short hash of where
    its checkpoints are (`checkpoint_url`: a URL, or an absolute path)."""
    where = hashlib.sha256(f"{checkpoint_url.rstrip('/')}/{job_name}".encode()).hexdigest()[:8]
    return os.path.join(local_state_dir, f"{job_name}-{where}")


def subtask_dir(local_root: str, operator: str, subtask: int) -> str:
    return os.path.join(local_root, operator, f"subtask-{subtask}")


@dataclass
class StateReport:
    """What happened to the local store before the epoch ran (sent to the driver)."""

    how: str = "local"  # local | retry | catch-up | rebuild | fresh (store_opening.How)
    why: str = ""  # the condition that proved `how`
    replayed: int = 0
    rebuild_ms: int = 0
    bytes_downloaded: int = 0
    durable_refs: list[str] = field(default_factory=list)  # pending change logs uploaded now
    pending_error: str | None = None
    corrupt_local: list[str] = field(default_factory=list)  # local snapshot-copy files that failed verification
    kept: bool = False  # the store was still open in this worker (it ran the subtask's last epoch)


class SubtaskState:
    """One subtask's state for one task. `open()` then either `retried_output()` or
    `commit(...)`, then `close()`."""

    def __init__(self, local_root: str, lineage: Lineage, fs: StorageFS, layout: JobLayout,
                 memory: StateMemory | None = None):
        """`memory`: the worker's state memory budget (None: each store unbounded, for
        tools that open one store in their own process)."""
        self.lineage = lineage
        self.memory = memory
        self.fs = fs
        self.layout = layout
        self.dir = subtask_dir(local_root, lineage.operator, lineage.subtask)
        self.db_dir = os.path.join(self.dir, "db")
        self.pending_dir = os.path.join(self.dir, "pending")
        self.report = StateReport()
        self.store: SubtaskStateStore | None = None
        self.given: EpochInput | None = None

    # -- bring the store to the lineage ----------------------------------------------
    def open(self, epoch: int, trust_local: bool = True, given: EpochInput | None = None) -> SubtaskStateStore:
        """A store holding exactly the state the task for `epoch` needs (the lineage's
        tip, `epoch - 1`), or, for a proven retry, the store at `epoch`: the decision
        table is `store_opening.decide`. `given`: the generation and slice the driver
        planned the epoch in (None: nothing proves a local store). `trust_local=False`
        (the restore job: the process or machine may have crashed, seed 003) rebuilds
        from files checked against the checkpoint's sizes and SHA-256s.

        Afterwards the store is labelled with `given`'s generation, so the epochs of
        this generation may use it, and those of another may not."""
        self._upload_pending()
        lin = self.lineage
        self.given = given
        store = self._open_existing() if trust_local and given is not None else None
        local = LocalStore.of(store.epoch(), store.lineage()) if store is not None else None
        decision = decide(lin, epoch, given, local, trust_local)
        self.report.how, self.report.why = decision.how.value, decision.why
        started = time.perf_counter()
        if decision.how in (How.RETRY, How.LOCAL, How.CATCH_UP):
            self.store = store
            if decision.how is How.CATCH_UP:
                self._replay(store, [c for c in lin.changelog if c.epoch > local.epoch])
                self.report.rebuild_ms = int((time.perf_counter() - started) * 1000)
            return store
        if store is not None:
            kept_stores.close(self.db_dir, store)
        self.store = self._rebuild()
        self.report.rebuild_ms = int((time.perf_counter() - started) * 1000)
        if given is not None:
            self._label(given.generation)
        return self.store

    def shared_memory(self) -> WorkerMemory | None:
        """This worker's shared state memory for the task's settings (None: unbounded)."""
        return worker_memory(self.memory) if self.memory is not None else None

    @property
    def _generation(self) -> str | None:
        return self.given.generation if self.given is not None else None

    def _label(self, generation: str) -> None:
        rec = self.store.lineage()
        if rec.get("generation") != generation:
            ref = rec.get("ref", "empty" if self.store.epoch() == NO_EPOCH else None)
            self.store.relabel({**rec, "ref": ref, "generation": generation, "slice": None})

    def _key_groups(self) -> range:
        return range(*self.lineage.key_groups)

    def _open_store(self, create: bool) -> SubtaskStateStore:
        kept_stores.release(self.db_dir)  # another worker of this executor may keep it open
        store = SubtaskStateStore.open(self.db_dir, create=create, operator=self.lineage.operator,
                                       key_groups=self._key_groups(), max_parallelism=self.lineage.max_parallelism,
                                       shared=self.shared_memory())
        kept_stores.opened(self.db_dir)
        return store

    def _open_existing(self) -> SubtaskStateStore | None:
        kept = kept_stores.take(self.db_dir)  # this worker ran the subtask last: still open
        if kept is not None:
            self.report.kept = True
            return kept
        if not os.path.exists(os.path.join(self.db_dir, "CURRENT")):
            return None
        try:
            return self._open_store(create=False)
        except StaleStateError as e:  # corrupt, locked, another layout: this copy is useless
            log.warning("local state of %s/%d is unusable (%s); rebuilding it from checkpoint storage",
                        self.lineage.operator, self.lineage.subtask, e)
            return None

    def _rebuild(self) -> SubtaskStateStore:
        from sparkpoint.state.restore import restore_snapshot

        lin = self.lineage
        if not lin.durable:
            raise StaleStateError(
                f"subtask {lin.subtask} of {lin.operator} has to be rebuilt on this executor, but the change "
                f"logs of epochs {[c.epoch for c in lin.pending]} never reached checkpoint storage (it was "
                "unreachable) and the executor holding them is gone; the job restores the last checkpoint")
        kept_stores.remove(self.db_dir)
        os.makedirs(self.dir, exist_ok=True)
        if lin.base is not None:
            local_copy = os.path.join(self.dir, f"snap-{lin.base_epoch}")
            report = restore_snapshot(lin.base, self.fs, self.layout, self.db_dir,
                                      local_copy_dir=local_copy if os.path.isdir(local_copy) else None)
            self.report.bytes_downloaded += report.bytes_remote
            self.report.corrupt_local = sorted(report.corrupt_local)
        store = self._open_store(create=True)
        self._replay(store, list(lin.changelog), base=True)
        return store

    def _replay(self, store: SubtaskStateStore, logs: list[ChangelogFile], base: bool = False) -> None:
        lin = self.lineage
        prev = store.lineage().get("ref") if not base else (lin.base_ref or "empty")
        if base and lin.base is not None and store.epoch() != lin.base_epoch:
            raise CorruptSnapshotError(f"snapshot {lin.base.get('id')} of {lin.operator}/{lin.subtask} holds epoch "
                                       f"{store.epoch()}, the checkpoint says {lin.base_epoch}")
        for c in logs:
            table = decode_changes(self._fetch(c), c.ref)
            keys = table.column("key").to_pylist()
            values = table.column("value").to_pylist()
            store.apply_changes(keys, values)
            store.commit_epoch(c.epoch, _EMPTY, {"ref": c.ref, "parent": prev, "entry": c.to_json(),
                                                 "generation": self._generation})
            prev = c.ref
            self.report.replayed += 1

    def _fetch(self, c: ChangelogFile) -> bytes:
        local = os.path.join(self.pending_dir, c.file.name)
        if os.path.exists(local) and check_local_file(local, c.file) is None:
            with open(local, "rb") as f:
                return f.read()
        remote = self.layout.join(c.file.path)
        try:
            raw = self.fs.read_bytes(remote)
        except FileNotFoundError:
            raise CorruptSnapshotError(f"change log {c.file.path} (epoch {c.epoch}) is missing from checkpoint "
                                       "storage; restore from another checkpoint") from None
        if len(raw) != c.file.size or hashlib.sha256(raw).hexdigest() != c.file.sha256:
            raise CorruptSnapshotError(f"change log {c.file.path} (epoch {c.epoch}) fails verification: "
                                       f"{len(raw)} bytes, expected {c.file.size} with sha256 {c.file.sha256[:16]}…; "
                                       "restore from another checkpoint")
        self.report.bytes_downloaded += len(raw)
        return raw

    # -- after the epoch's rows were applied ---------------------------------------
    def commit(self, epoch: int, output: pa.Table) -> ChangelogFile:
        """Write the epoch's change log to storage (durably, before anything else), then
        commit the epoch locally. If storage refuses, the change log waits in `pending/`
        and the entry says so: the job keeps running, checkpoints wait for it."""
        store = self.store
        raw = encode_changes(store.pending_changes())
        name, path = changelog_path(self.lineage.operator, self.lineage.subtask, epoch)
        os.makedirs(self.pending_dir, exist_ok=True)
        local = os.path.join(self.pending_dir, name)
        # No fsync here: this copy matters only while storage refuses the upload, and a
        # crash of this machine loses the local store it belongs to as well. The upload
        # itself is fsynced (StorageFS.put_file) before the epoch commits.
        with open(local, "wb") as f:
            f.write(raw)
        file = SnapshotFile(name, path, len(raw), hashlib.sha256(raw).hexdigest(), shared=True)
        durable = self._upload(local, file)
        entry = ChangelogFile(epoch, file, durable)
        # The record proves a retry of this epoch later: same parent, generation and slice.
        store.commit_epoch(epoch, output, {"ref": entry.ref, "parent": self.lineage.tip_ref, "entry": entry.to_json(),
                                           "generation": self._generation,
                                           "slice": self.given.slice if self.given is not None else None})
        return entry

    def _upload(self, local: str, file: SnapshotFile) -> bool:
        try:
            self.fs.put_file(local, self.layout.join(file.path))
        except StorageError as e:
            self.report.pending_error = str(e)
            log.warning("change log %s stays on this executor until checkpoint storage takes it: %s", file.name, e)
            return False
        os.unlink(local)
        return True

    def _upload_pending(self) -> None:
        """Retry change logs that storage refused earlier (they are still referenced by
        the driver's lineage as not durable)."""
        if not os.path.isdir(self.pending_dir):
            return
        wanted = {c.file.name: c for c in self.lineage.pending}
        for name in sorted(os.listdir(self.pending_dir)):
            c = wanted.get(name)
            local = os.path.join(self.pending_dir, name)
            if c is None:
                if not any(x.file.name == name for x in self.lineage.changelog):
                    os.unlink(local)  # of an attempt the driver never saw, or already durable
                continue
            if self._upload(local, c.file):
                self.report.durable_refs.append(c.ref)

    def retried_output(self) -> tuple[pa.Table | None, ChangelogFile | None]:
        rec = self.store.lineage()
        entry = ChangelogFile.from_json(rec["entry"]) if rec.get("entry") else None
        if entry is not None and not entry.durable:
            local = os.path.join(self.pending_dir, entry.file.name)
            if os.path.exists(local) and self._upload(local, entry.file):
                entry = ChangelogFile(entry.epoch, entry.file, True)
        return self.store.last_output(), entry

    def materialize(self, epoch: int, checkpoint_id: int | None = None) -> dict:
        """Upload a snapshot of the committed state (incremental: SSTs already in storage
        are referenced, not uploaded). Returns its handle, with a unique `id`."""
        from sparkpoint.runtime.executor.storage import HASH_CACHE
        from sparkpoint.state.upload import upload_snapshot

        lin = self.lineage
        target = os.path.join(self.dir, f"snap-{epoch}")
        shutil.rmtree(target, ignore_errors=True)
        self.store.create_local_checkpoint(target)
        previous = SnapshotHandleIndex.from_handles([lin.base] if lin.base is not None else [])
        result = upload_snapshot(target, self.fs, self.layout, epoch, state_participant_path(lin.operator, lin.subtask),
                                 previous=previous, hash_cache=HASH_CACHE, all_shared=True)
        for name in os.listdir(self.dir):  # keep only the newest local snapshot copy
            if name.startswith("snap-") and name != f"snap-{epoch}":
                shutil.rmtree(os.path.join(self.dir, name), ignore_errors=True)
        handle = dict(result.handle)
        handle["id"] = uuid.uuid4().hex[:16]
        handle["epoch"] = epoch
        # The snapshot holds the state whose id is the change log of `epoch`: a store
        # rebuilt from it and one that replayed that log are the same state.
        handle["ref"] = self.store.lineage().get("ref")
        handle["bytes_uploaded"] = result.metrics.bytes_uploaded
        return handle

    def close(self, keep: bool = False) -> None:
        """Done with the store; `keep`: the epoch committed, keep it open in this worker
        for the subtask's next epoch (see kept_stores)."""
        if self.store is not None:
            if keep:
                kept_stores.keep(self.db_dir, self.store)
            else:
                kept_stores.close(self.db_dir, self.store)
            self.store = None


_EMPTY = pa.table({})


def fresh_lineage(operator: str, subtask: int, parallelism: int, max_parallelism: int) -> Lineage:
    kg = key_group_range(subtask, parallelism, max_parallelism)
    return Lineage(operator, subtask, (kg.start, kg.stop), max_parallelism)
