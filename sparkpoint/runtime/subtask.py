"""What one stateful subtask does in one epoch, inside a Spark Python worker.

See sparkpoint/state/interfaces.py for the protocol. This module is imported in
the worker, so it must not import pyspark at module level."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.errors import StaleStateError
from sparkpoint.state.interfaces import MARKER_COL, SUBTASK_COL, EpochContext, StatefulOperator

META_SUBTASK = "__meta_subtask"
META_ROWS = "__meta_rows"
META_MS = "__meta_ms"
META_ERROR = "__meta_error"
META_FIELDS = [
    pa.field(META_SUBTASK, pa.int32()),
    pa.field(META_ROWS, pa.int64()),
    pa.field(META_MS, pa.int64()),
    pa.field(META_ERROR, pa.string()),
]


def store_dir(local_root: str, operator: str, subtask: int) -> str:
    return os.path.join(local_root, operator, f"subtask-{subtask}", "db")


def local_checkpoint_dir(local_root: str, operator: str, subtask: int, checkpoint_id: int) -> str:
    return os.path.join(local_root, operator, f"subtask-{subtask}", f"chk-{checkpoint_id}")


def output_schema_with_meta(operator: StatefulOperator) -> pa.Schema:
    fields = [f.with_nullable(True) for f in operator.output_schema]
    return pa.schema(fields + META_FIELDS)


@dataclass(frozen=True)
class EpochTask:
    """Everything the worker needs for one epoch; shipped with the function."""

    operator: StatefulOperator
    local_root: str
    epoch: int
    parallelism: int
    max_parallelism: int
    watermark_ms: int | None
    processing_time_ms: int
    final: bool
    checkpoint_id: int | None
    # Fault rehearsal: subtasks whose synchronous snapshot part must fail (testing/participant_faults).
    fail_sync_subtasks: tuple[int, ...] = ()

    def __call__(self, table: pa.Table) -> pa.Table:
        from sparkpoint.state.store import SubtaskStateStore

        started = time.perf_counter()
        subtask = int(table.column(SUBTASK_COL)[0].as_py())
        is_marker = pc.fill_null(table.column(MARKER_COL), False)
        rows = table.filter(pc.invert(is_marker)).drop_columns([SUBTASK_COL, MARKER_COL])
        schema = output_schema_with_meta(self.operator)
        ctx = EpochContext(self.epoch, subtask, self.parallelism, self.max_parallelism, self.watermark_ms,
                           self.processing_time_ms, self.final, self.checkpoint_id)

        path = store_dir(self.local_root, self.operator.name, subtask)
        fresh_job = self.epoch == 0
        if not fresh_job and not os.path.isdir(path):
            raise StaleStateError(f"subtask {subtask} of {self.operator.name}: local state {path} is missing "
                                  f"before epoch {self.epoch}; the job restores it from the last checkpoint")
        from sparkpoint.state.keys import key_group_range

        store = SubtaskStateStore.open(path, create=fresh_job, operator=self.operator.name,
                                       key_groups=key_group_range(subtask, self.parallelism, self.max_parallelism),
                                       max_parallelism=self.max_parallelism)
        try:
            have = store.epoch()
            if have == self.epoch:
                # Spark re-ran this task (retry or recomputation): same output, state untouched.
                out = store.last_output()
                out = out if out is not None else pa.Table.from_pylist([], self.operator.output_schema)
            elif have != self.epoch - 1:
                raise StaleStateError(f"subtask {subtask} of {self.operator.name}: local state is at epoch "
                                      f"{have}, expected {self.epoch - 1}; restoring from the last checkpoint")
            else:
                out = self.operator.apply(store, rows, ctx)
                store.commit_epoch(self.epoch, out)
            error = None
            if self.checkpoint_id is not None:
                error = self._sync_part(store, subtask)
        finally:
            store.close()
        return _with_meta(out, schema, subtask, rows.num_rows, int((time.perf_counter() - started) * 1000), error)

    def _sync_part(self, store, subtask: int) -> str | None:
        """The synchronous snapshot part. A failure here fails only this checkpoint
        (seed 001): it is reported to the driver, which declines; the task succeeds."""
        target = local_checkpoint_dir(self.local_root, self.operator.name, subtask, self.checkpoint_id)
        try:
            if subtask in self.fail_sync_subtasks:
                raise OSError("injected fault: synchronous snapshot part")
            if os.path.exists(target):
                return None  # a re-run of this task already took it (same epoch, same state)
            store.create_local_checkpoint(target)
            return None
        except Exception as e:  # reported, never raised: a snapshot failure must not fail the task
            return f"{type(e).__name__}: {e}"


def _with_meta(out: pa.Table, schema: pa.Schema, subtask: int, rows: int, ms: int, error: str | None) -> pa.Table:
    n = out.num_rows
    cols = {}
    for f in schema:
        if f.name in out.column_names:
            cols[f.name] = pa.concat_arrays([out.column(f.name).combine_chunks().cast(f.type),
                                             pa.nulls(1, f.type)])
    meta_values = {META_SUBTASK: subtask, META_ROWS: rows, META_MS: ms, META_ERROR: error}
    for f in META_FIELDS:
        cols[f.name] = pa.concat_arrays([pa.nulls(n, f.type), pa.array([meta_values[f.name]], f.type)])
    return pa.Table.from_pydict({f.name: cols[f.name] for f in schema}, schema=schema)
