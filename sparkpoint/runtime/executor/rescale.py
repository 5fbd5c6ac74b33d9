"""Re-cut restored state into new subtasks, on the executors (rescaling, and every
restore from a savepoint).

Keys start with their key group (state/keys.py), and a subtask owns a contiguous
key-group range, so new subtask j's state is the union of the key-group slices
[start_j, stop_j) of the old subtasks whose ranges overlap it (Flink's key-group
redistribution). For each new subtask one task:

  1. rebuilds each overlapping old lineage (snapshot + change logs, verified) in a
     scratch directory, from wherever its files are (the job's checkpoints or a
     savepoint directory);
  2. copies the keys of its range into a fresh store at the restored epoch;
  3. uploads that store as a full snapshot into the job's own checkpoint storage.

The new lineage (that snapshot, no change logs) goes back to the driver, and the store
stays on the executor, labelled with the restore's generation: the first epoch that
runs the subtask there uses it as it is. The job then
references nothing in the savepoint it started from: a savepoint restored this way
is never claimed (Flink's NO_CLAIM), and the first checkpoint is self-sufficient."""

from __future__ import annotations

import json
import contextlib
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkpoint.state.changelog import Lineage
from sparkpoint.state.keys import META_PREFIX
from sparkpoint.state.memory import StateMemory
from sparkpoint.state.store import SubtaskStateStore

_BATCH = 50_000
_OPERATOR_META = META_PREFIX + b"meta/op/"  # operator-level metadata (key schema, counters)


@dataclass(frozen=True)
class RescaleTask:
    """Build new subtask `j`'s store from the old lineages (see the module docstring)."""

    local_root: str
    source: Any             # StorageRef where the old lineages' files are
    target: Any             # StorageRef of the job's own checkpoint storage
    old: dict[int, Lineage]
    new: dict[int, Lineage]  # empty lineages with the new key-group ranges
    epoch: int
    memory: StateMemory = field(default=StateMemory(), kw_only=True)  # state.backend.rocksdb.memory.*
    # The generation the restore begins: the store re-cut here is labelled with it, so the
    # first epoch after the restore uses it instead of rebuilding it again
    # (executor/store_opening.py).
    generation: str = field(kw_only=True)

    def __call__(self, table: pa.Table) -> pa.Table:
        from sparkpoint.runtime.executor import kept_stores
        from sparkpoint.runtime.executor.state import SubtaskState, subtask_dir
        from sparkpoint.runtime.executor.subtask import (
            SUBTASK_COL,
            output_schema_with_meta,
            restore_failure,
            where_am_i,
            with_meta,
        )

        started = time.perf_counter()
        j = int(table.column(SUBTASK_COL)[0].as_py())
        new = self.new[j]
        lo, hi = new.key_groups
        src_fs, src_layout = self.source.open()
        scratch = os.path.join(self.local_root, new.operator, f"rescale-{j}-{uuid.uuid4().hex[:8]}")
        state = SubtaskState(self.local_root, new, *self.target.open(), self.memory)
        kept_stores.remove(state.db_dir)  # a worker may keep the old store of subtask j open
        shutil.rmtree(subtask_dir(self.local_root, new.operator, j), ignore_errors=True)
        store = SubtaskStateStore.open(state.db_dir, create=True, operator=new.operator,
                                       key_groups=range(lo, hi), max_parallelism=new.max_parallelism,
                                       shared=state.shared_memory())
        keys_copied, downloaded, sources, lineage = 0, 0, [], None
        with restore_failure() as failure, contextlib.ExitStack() as cleanup:
            cleanup.callback(shutil.rmtree, scratch, ignore_errors=True)
            cleanup.callback(state.close)
            for i, old in sorted(self.old.items()):
                o_lo, o_hi = old.key_groups
                if o_hi <= lo or o_lo >= hi:
                    continue
                sources.append(i)
                src = SubtaskState(scratch, old, src_fs, src_layout, self.memory)
                try:
                    old_store = src.open(old.epoch + 1, trust_local=False)
                    downloaded += src.report.bytes_downloaded
                    keys_copied += _copy_range(old_store, store, max(lo, o_lo), min(hi, o_hi))
                    if o_lo <= lo < o_hi:  # operator metadata from the subtask that held our first group
                        _copy_prefix(old_store, store, _OPERATOR_META)
                finally:
                    src.close()
            ref = f"rescaled:{uuid.uuid4().hex[:16]}"
            store.commit_epoch(self.epoch, pa.table({}), {"ref": ref, "parent": None, "generation": self.generation})
            state.store = store
            handle = state.materialize(self.epoch)
            lineage = Lineage(new.operator, j, new.key_groups, new.max_parallelism, epoch=self.epoch,
                              base=handle, base_epoch=self.epoch)
        info = {**where_am_i(), "lineage": lineage.to_json() if lineage is not None else None,
                "from_subtasks": sources, "keys": keys_copied, **failure,
                "state": {"how": "rebuild", "bytes_downloaded": downloaded,
                          "rebuild_ms": int((time.perf_counter() - started) * 1000)}}
        ms = int((time.perf_counter() - started) * 1000)
        return with_meta(None, output_schema_with_meta(pa.schema([])), j, 0, ms, failure.get("error"),
                         json.dumps(info))


def _copy_range(src: SubtaskStateStore, dst: SubtaskStateStore, lo: int, hi: int) -> int:
    """Copy every key of key groups [lo, hi); returns how many."""
    return _copy(src.scan_range(lo.to_bytes(2, "big"), hi.to_bytes(2, "big")), dst)


def _copy_prefix(src: SubtaskStateStore, dst: SubtaskStateStore, prefix: bytes) -> int:
    return _copy(src.scan_prefix(prefix), dst)


def _copy(rows, dst: SubtaskStateStore) -> int:
    n, keys, values = 0, [], []
    for k, v in rows:
        keys.append(k)
        values.append(v)
        if len(keys) >= _BATCH:
            dst.apply_changes(keys, values)
            n, keys, values = n + len(keys), [], []
    if keys:
        dst.apply_changes(keys, values)
        n += len(keys)
    return n
