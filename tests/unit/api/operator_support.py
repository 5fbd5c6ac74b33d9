"""Runs operators the way the runtime's Python worker does (state/interfaces.py, step 3),
on real RocksDB directories, without Spark."""

from __future__ import annotations

import zlib
from pathlib import Path

import pyarrow as pa

from sparkpoint.state.interfaces import EpochContext, StatefulOperator
from sparkpoint.state.store import SubtaskStateStore

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


def run_epoch(state_dir: Path, op: StatefulOperator, rows: pa.Table, context: EpochContext) -> pa.Table:
    """The worker's protocol: open, skip if already committed, apply, commit, close."""
    with SubtaskStateStore.open(str(state_dir / f"{op.name}-{context.subtask}"), operator=op.name) as store:
        if store.epoch() == context.epoch:
            return store.last_output()
        assert store.epoch() == context.epoch - 1
        out = op.apply(store, rows, context)
        store.commit_epoch(context.epoch, out)
        return out


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
