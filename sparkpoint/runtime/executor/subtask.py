"""What one stateful subtask does in one epoch, inside a Spark Python worker.

    state = the subtask's store at the lineage's tip   (local, caught up, or rebuilt)
    out   = operator.apply(store, rows)                 (or the stored output of a re-run)
    the epoch's change log -> checkpoint storage, then the epoch commits locally
    [snapshot upload, when the driver asks]
    out  -> the sink's executor-side writer (only handles go back), or back to the driver

The task returns the output rows (sinks without a writer) plus ONE meta row that
tells the driver what happened: rows, time, the change-log entry, a snapshot
handle, how the state was obtained, and the sink's staged-file handles.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.errors import CorruptSnapshotError, StorageError
from sparkpoint.runtime.executor.store_opening import EpochInput
from sparkpoint.state.changelog import Lineage
from sparkpoint.state.keys import key_group_range
from sparkpoint.state.interfaces import (
    CARRIED_COLS,
    INPUT_COUNT_COL,
    KEY_GROUP_COL,
    MARKER_COL,
    MAX_EVENT_TIME_COL,
    SUBTASK_COL,
    EpochContext,
    StatefulOperator,
)
from sparkpoint.state.memory import StateMemory

META_SUBTASK = "__meta_subtask"
META_ROWS = "__meta_rows"
META_MS = "__meta_ms"
META_ERROR = "__meta_error"
META_INFO = "__meta_info"
META_FIELDS = [
    pa.field(META_SUBTASK, pa.int32()),
    pa.field(META_ROWS, pa.int64()),
    pa.field(META_MS, pa.int64()),
    pa.field(META_ERROR, pa.string()),
    pa.field(META_INFO, pa.string()),
]
META_NAMES = [f.name for f in META_FIELDS]


def output_schema_with_meta(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema] + META_FIELDS)


def where_am_i() -> dict[str, Any]:
    """Which executor runs this task: PySpark forks every Python worker of one executor
    from that executor's daemon, so (host, daemon pid) names the executor."""
    return {"host": socket.gethostname(), "executor": f"{socket.gethostname()}/{os.getppid()}", "pid": os.getpid()}


@dataclass(frozen=True)
class OutputStep:
    """Output rows -> the sink: through `output_maps`, then the executor-side writer
    (handles go back) or back to the driver (rows go back)."""

    output_maps: tuple[Callable[[pa.Table], pa.Table], ...] = ()
    writer: Any = None  # sparkpoint.connectors.base.EpochWriter | None

    def __call__(self, epoch: int, part: int, out: pa.Table) -> tuple[pa.Table | None, list[dict]]:
        if self.writer is None:
            return out, []  # the driver maps and stages it (the task's schema is the operator's)
        return None, list(self.writer.write(epoch, part, self.map(out)))

    def map(self, out: pa.Table) -> pa.Table:
        for fn in self.output_maps:
            out = fn(out)
        return out


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
    storage: Any  # sparkpoint.runtime.executor.storage.StorageRef
    lineages: dict[int, Lineage]
    materialize: frozenset[int] = frozenset()
    output: OutputStep = OutputStep()
    # Fault rehearsal: subtasks whose synchronous snapshot part must fail (sparkpoint.faults).
    fail_sync_subtasks: tuple[int, ...] = ()
    # The barrier of this epoch is a savepoint's: copy the state files there (SavepointTarget).
    savepoint_to: Any = None
    # The generation and slice the driver planned this epoch in: what proves a retry,
    # and which local stores may be used at all (executor/store_opening.py).
    epoch_input: EpochInput = field(kw_only=True)
    memory: StateMemory = field(default=StateMemory(), kw_only=True)  # state.backend.rocksdb.memory.*
    # The step's first epoch on empty state: its operator's initial state joins the rows (stage.run_epoch).
    initial_state: bool = field(default=False, kw_only=True)

    def __call__(self, table: pa.Table) -> pa.Table:
        """`run` for rows grouped as `groupBy(__subtask)` hands them: the subtask is the
        rows' own, and marker rows (one per subtask, so that none is ever skipped) go."""
        subtask = int(table.column(SUBTASK_COL)[0].as_py())
        if MARKER_COL in table.column_names:
            table = table.filter(pc.invert(pc.fill_null(table.column(MARKER_COL), False)))
        return self.run(subtask, table)

    def _rows_are_mine(self, subtask: int, table: pa.Table) -> bool:
        if KEY_GROUP_COL in table.column_names:
            # The epoch's rows carry their key group, not their subtask (one column less
            # through the shuffle): every key group must be in this subtask's range.
            groups = key_group_range(subtask, self.parallelism, self.max_parallelism)
            lo_hi = pc.min_max(table.column(KEY_GROUP_COL))
            return groups.start <= lo_hi["min"].as_py() and lo_hi["max"].as_py() < groups.stop
        return pc.all(pc.equal(table.column(SUBTASK_COL), subtask)).as_py()

    def run(self, subtask: int, table: pa.Table) -> pa.Table:
        """Subtask `subtask`'s epoch over `table`, its rows (key groups and subtask id
        attached); the output rows plus one meta row."""
        from sparkpoint.runtime.executor.state import SubtaskState

        started = time.perf_counter()
        if table.num_rows and not self._rows_are_mine(subtask, table):
            raise RuntimeError(f"the rows handed to subtask {subtask} belong to other subtasks "
                               "(Spark partitioned the epoch differently than the runtime asked)")
        info: dict[str, Any] = where_am_i()
        if INPUT_COUNT_COL in table.column_names:  # carried through the pre-aggregation
            info["input"] = int(pc.sum(table.column(INPUT_COUNT_COL)).as_py() or 0)
            # Carried only for jobs with event time.
            has_ts = MAX_EVENT_TIME_COL in table.column_names
            info["max_ts"] = pc.max(table.column(MAX_EVENT_TIME_COL)).as_py() if has_ts else None
        rows = table.drop_columns([c for c in (SUBTASK_COL, MARKER_COL, *CARRIED_COLS) if c in table.column_names])
        ctx = EpochContext(self.epoch, subtask, self.parallelism, self.max_parallelism, self.watermark_ms,
                           self.processing_time_ms, self.final, self.checkpoint_id)
        fs, layout = self.storage.open(self.checkpoint_id)
        state = SubtaskState(self.local_root, self.lineages[subtask], fs, layout, self.memory)
        committed = False
        phases = info["phase_ms"] = {}  # where the task's time went (bench/w1_epoch_profile.py)
        mark = time.perf_counter()

        def phase(name: str) -> None:
            nonlocal mark
            now = time.perf_counter()
            phases[name] = round((now - mark) * 1000, 1)
            mark = now

        try:
            store = state.open(self.epoch, given=self.epoch_input)
            phase("open")
            if state.report.how == "retry":
                # Spark re-ran this task (retry or recomputation): same output, state untouched.
                out, entry = state.retried_output()
                if out is None or out.num_columns == 0:
                    out = pa.Table.from_pylist([], self.operator.output_schema)
            else:
                dropped = getattr(self.operator, "dropped_count", None)  # windows count late rows
                before = dropped(store) if dropped else 0
                out = self.operator.apply(store, rows, ctx)
                if dropped:
                    info["late_dropped"] = dropped(store) - before
                phase("apply")
                entry = state.commit(self.epoch, out)
                phase("commit")
            info["changelog"] = entry.to_json() if entry is not None else None
            if subtask in self.materialize and entry is not None and entry.durable:
                try:
                    info["snapshot"] = state.materialize(self.epoch, self.checkpoint_id)
                except Exception as e:  # a failed upload only delays the next snapshot
                    info["snapshot_error"] = f"{type(e).__name__}: {e}"
            if self.savepoint_to is not None and entry is not None and entry.durable:
                from sparkpoint.runtime.executor.savepoint import copy_state_files, lineage_files

                try:
                    files = lineage_files(self.lineages[subtask], entry, info.get("snapshot"))
                    info["savepoint"] = copy_state_files(files, fs, layout, self.savepoint_to)
                except Exception as e:  # fails the savepoint only (it finds files missing)
                    info["savepoint_error"] = f"{type(e).__name__}: {e}"
            phase("snapshot")
            committed = True
        finally:
            state.close(keep=committed)
        phase("close")
        error = None
        if self.checkpoint_id is not None and subtask in self.fail_sync_subtasks:
            error = "OSError: injected fault: synchronous snapshot part"
        info["state"] = state.report.__dict__
        data, info["sink"] = self.output(self.epoch, subtask, out)
        phase("sink")
        info["ended_at"] = time.time()  # the driver orders the next epoch's tasks by it (stage.run_epoch)
        info_json = json.dumps(info, default=str)
        ms = int((time.perf_counter() - started) * 1000)
        return with_meta(data, output_schema_with_meta(self.operator.output_schema), subtask, rows.num_rows, ms,
                         error, info_json)


def with_meta(out: pa.Table | None, schema: pa.Schema, subtask: int, rows: int, ms: int, error: str | None,
              info: str) -> pa.Table:
    n = 0 if out is None else out.num_rows
    cols = {}
    for f in schema:
        if f.name in META_NAMES:
            continue
        if out is not None and f.name in out.column_names:
            cols[f.name] = pa.concat_arrays([out.column(f.name).combine_chunks().cast(f.type), pa.nulls(1, f.type)])
        else:
            cols[f.name] = pa.nulls(n + 1, f.type)
    meta_values = {META_SUBTASK: subtask, META_ROWS: rows, META_MS: ms, META_ERROR: error, META_INFO: info}
    for f in META_FIELDS:
        cols[f.name] = pa.concat_arrays([pa.nulls(n, f.type), pa.array([meta_values[f.name]], f.type)])
    return pa.Table.from_pydict({f.name: cols[f.name] for f in schema}, schema=schema)


@dataclass(frozen=True)
class RestoreTask:
    """Bring each subtask's store to its restored lineage on an executor, from files
    verified against the checkpoint (never trusting local disk), before the driver
    touches the sink: a checkpoint whose files fail verification is found here, while
    falling back to an older one still costs nothing."""

    local_root: str
    storage: Any
    lineages: dict[int, Lineage]
    # The generation the restore begins: the stores rebuilt here are labelled with it,
    # so the first epoch after the restore uses them (executor/store_opening.py).
    generation: str = field(kw_only=True)
    memory: StateMemory = field(default=StateMemory(), kw_only=True)

    def __call__(self, table: pa.Table) -> pa.Table:
        from sparkpoint.runtime.executor.state import SubtaskState

        started = time.perf_counter()
        subtask = int(table.column(SUBTASK_COL)[0].as_py())
        lineage = self.lineages[subtask]
        fs, layout = self.storage.open()
        state = SubtaskState(self.local_root, lineage, fs, layout, self.memory)
        with restore_failure() as failure:
            try:
                state.open(lineage.epoch + 1, trust_local=False, given=EpochInput(self.generation, ""))
            finally:
                state.close()
        info = {**where_am_i(), "state": state.report.__dict__, **failure}
        ms = int((time.perf_counter() - started) * 1000)
        return with_meta(None, output_schema_with_meta(pa.schema([])), subtask, 0, ms, failure.get("error"),
                         json.dumps(info))


# How a restore task's failure travels to the driver: by kind, in its meta row. The
# exception Spark would carry arrives as a worker's traceback text, and that text (its
# source lines included) cannot tell a damaged file from a storage outage.
RESTORE_CORRUPT, RESTORE_STORAGE = "corrupt", "storage"


@contextlib.contextmanager
def restore_failure():
    """Catches what a restore task's driver must tell apart into a dict for its info:
    `{"error_kind": ..., "error": ...}` (empty when the task succeeded). Other errors
    fail the Spark task as they are."""
    failure: dict[str, str] = {}
    try:
        yield failure
    except CorruptSnapshotError as e:
        failure.update(error_kind=RESTORE_CORRUPT, error=f"{type(e).__name__}: {e}")
    except StorageError as e:
        failure.update(error_kind=RESTORE_STORAGE, error=f"{type(e).__name__}: {e}")


def raise_restore_failure(reports: dict[int, dict[str, Any]]) -> None:
    """On the driver: a restore task's failure as its own type again. Corruption wins
    over an outage (an older checkpoint is then tried, which an outage alone never
    justifies)."""
    for kind, error in ((RESTORE_CORRUPT, CorruptSnapshotError), (RESTORE_STORAGE, StorageError)):
        failed = sorted(i for i, r in reports.items() if r.get("error_kind") == kind)
        if failed:
            raise error(f"subtask {failed[0]}: {reports[failed[0]]['error']}"
                        + (f" (and {len(failed) - 1} more subtask(s))" if len(failed) > 1 else ""))
