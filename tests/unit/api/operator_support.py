"""Runs operators the way the runtime's Python worker does (state/interfaces.py, step 3),
on real RocksDB directories, without Spark."""

from __future__ import annotations

import zlib
from pathlib import Path

import pyarrow as pa

import json
import os

from sparkpoint.runtime.executor.state import fresh_lineage, subtask_dir
from sparkpoint.runtime.executor.storage import StorageRef
from sparkpoint.runtime.executor.store_opening import EpochInput
from sparkpoint.runtime.executor.subtask import META_INFO, EpochTask
from sparkpoint.runtime.stage import split_meta
from sparkpoint.state.changelog import ChangelogFile, Lineage
from sparkpoint.state.interfaces import MARKER_COL, SUBTASK_COL, EpochContext, StatefulOperator

MAX_PARALLELISM = 16


def with_key_groups(rows: pa.Table, key_columns: list[str], max_parallelism: int = MAX_PARALLELISM) -> pa.Table:
    """Adds `__kg` like the runtime does (a stable hash of the key; not Spark's xxhash64)."""
    keys = zip(*[rows.column(c).to_pylist() for c in key_columns])
    groups = [zlib.crc32(repr(k).encode()) % max_parallelism for k in keys]
    return rows.append_column("__kg", pa.array(groups, pa.int32()))


def subtask_of(key_group: int, parallelism: int, max_parallelism: int = MAX_PARALLELISM) -> int:
    return key_group * parallelism // max_parallelism


def ctx(epoch: int, watermark_ms: int | None = None, *, final: bool = False, processing_time_ms: int = 0,
        subtask: int = 0, parallelism: int = 1) -> EpochContext:
    return EpochContext(epoch=epoch, subtask=subtask, parallelism=parallelism, max_parallelism=MAX_PARALLELISM,
                        watermark_ms=watermark_ms, processing_time_ms=processing_time_ms, final=final)


def store_path(state_dir: Path, op: StatefulOperator, subtask: int = 0) -> str:
    """Where the worker step keeps `op`'s state for `subtask` under `state_dir`."""
    return os.path.join(subtask_dir(str(state_dir), op.name, subtask), "db")


# The driver's part, per (state dir, operator, subtask): the lineage the next epoch's task gets.
_LINEAGES: dict[tuple[str, str, int], Lineage] = {}


def worker_input(rows: pa.Table, subtask: int) -> pa.Table:
    """What groupBy(__subtask) hands one subtask: its rows plus its one marker row."""
    n = rows.num_rows
    data = rows.append_column(SUBTASK_COL, pa.array([subtask] * n, pa.int32())) \
               .append_column(MARKER_COL, pa.array([False] * n, pa.bool_()))
    schema = pa.schema([f.with_nullable(True) for f in data.schema])
    marker = {f.name: pa.nulls(1, f.type) for f in schema}
    marker[SUBTASK_COL] = pa.array([subtask], pa.int32())
    marker[MARKER_COL] = pa.array([True])
    return pa.concat_tables([data.cast(schema), pa.table(marker, schema=schema)])


def run_epoch(state_dir: Path, op: StatefulOperator, rows: pa.Table, context: EpochContext) -> pa.Table:
    """One subtask's epoch through the runtime's own worker step (runtime.subtask.EpochTask):
    open with a version check, apply, commit atomically, or return the committed output
    when the same epoch runs again."""
    if all(c in rows.column_names and not pa.types.is_null(rows.schema.field(c).type) for c in op.key_columns):
        op.resolve_input_schema(rows.schema)  # the driver's step (stage.run_epoch); untyped empty inputs skip it
    key = (str(state_dir), op.name, context.subtask)
    lineage = _LINEAGES.get(key)
    if lineage is None or lineage.epoch >= context.epoch:
        # A fresh run, or the same epoch again: the lineage as of the epoch before.
        lineage = _LINEAGES.get((*key, context.epoch - 1)) or fresh_lineage(
            op.name, context.subtask, context.parallelism, context.max_parallelism)  # type: ignore[arg-type]
    storage = StorageRef(str(Path(state_dir) / "_checkpoints"), "job")
    task = EpochTask(op, str(state_dir), context.epoch, context.parallelism, context.max_parallelism,
                     context.watermark_ms, context.processing_time_ms, context.final, None, storage,
                     {context.subtask: lineage},
                     # One generation per harness process; "the same epoch again" is a retry of its slice.
                     epoch_input=EpochInput("harness", f"epoch-{context.epoch}"))
    data, meta = split_meta(task(worker_input(rows, context.subtask)), op.output_schema)
    entry = json.loads(meta[0][META_INFO])["changelog"]
    if lineage.epoch == context.epoch - 1:
        _LINEAGES[(*key, context.epoch - 1)] = lineage  # type: ignore[index]
        _LINEAGES[key] = lineage.advance(ChangelogFile.from_json(entry))
    return data


def run_partitioned(state_dir: Path, op: StatefulOperator, rows: pa.Table, context: EpochContext,
                    parallelism: int) -> pa.Table:
    """Splits keyed rows by subtask like groupBy(__subtask) and runs every subtask."""
    subtasks = [subtask_of(kg, parallelism) for kg in rows.column("__kg").to_pylist()]
    outputs = []
    for s in range(parallelism):
        part = rows.filter(pa.array([x == s for x in subtasks], pa.bool_()))
        c = EpochContext(context.epoch, s, parallelism, MAX_PARALLELISM, context.watermark_ms,
                         context.processing_time_ms, context.final)
        outputs.append(run_epoch(state_dir, op, part, c))
    return pa.concat_tables(outputs)
