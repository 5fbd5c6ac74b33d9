"""One epoch's Spark work: stateless steps, pre-aggregation, key groups, one
vectorized call per subtask on the executors; back on the driver come one meta row
per task (and the output rows only for sinks that stage on the driver)."""

from __future__ import annotations

import inspect
import json
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api import event_time
from sparkpoint.runtime.connect import observe, observed
from sparkpoint.runtime.executor.subtask import (
    META_ERROR,
    META_INFO,
    META_MS,
    META_NAMES,
    META_ROWS,
    META_SUBTASK,
    EpochTask,
    OutputStep,
    RestoreTask,
    output_schema_with_meta,
    raise_restore_failure,
    where_am_i,
    with_meta,
)
from sparkpoint.runtime.executor.worker_heap import freeze_long_lived_objects
from sparkpoint.state.interfaces import INPUT_COUNT_COL, KEY_GROUP_COL, MAX_EVENT_TIME_COL, SUBTASK_COL


@dataclass
class EpochResult:
    output: pa.Table | None  # None when the sink staged the output on the executors
    input_records: int
    max_event_time_ms: int | None
    # subtask -> error text of its synchronous snapshot part (None = ok); only with a barrier
    sync_errors: dict[int, str | None]
    subtask_rows: dict[int, int]
    subtask_ms: dict[int, int]
    infos: dict[int, dict[str, Any]] = field(default_factory=dict)
    sink_handles: list[dict[str, Any]] = field(default_factory=list)

    @property
    def worker_order(self) -> list[int]:
        """The subtasks in the order their tasks ended: pass it as the next epoch's
        `partition_order` (see `run_epoch`)."""
        return sorted(self.infos, key=lambda s: (self.infos[s].get("ended_at") or 0.0, s))

    @property
    def output_rows(self) -> int:
        if self.output is not None:
            return self.output.num_rows
        return sum(int(h.get("rows", 0)) for h in self.sink_handles)


def _observe(df, event_time_column: str | None, epoch: int):
    from pyspark.sql import functions as F

    metrics = [F.count(F.lit(1)).alias("n")]
    if event_time_column:
        # Refuses a column of another type with one ConfigError, before any work runs.
        ts = event_time.spark_ms(df, event_time_column, f".watermark({event_time_column!r}, ...)")
        metrics.append(F.max(ts).alias("max_ts"))
    # Observed metrics are collected by the epoch's one action: no extra Spark job.
    return observe(df, f"epoch-{epoch}", *metrics)


def _pre_aggregate_counting(op, df, event_time_column: str | None, epoch: int):
    """`op.pre_aggregate(df)` carrying, per row, how many input rows it stands for and
    their latest event time: the subtasks add them up, so the epoch's record count and
    max event time cost two more aggregate columns instead of an observed pass over the
    input (`df.observe` breaks Spark's whole-stage code generation of the scan).
    Returns (rows, None), or (rows, Observation) for an operator of its own whose
    pre-aggregation does not take the carried columns."""
    from pyspark.sql import functions as F

    # Without event time there is no max to carry (the subtasks report None).
    carry = [F.count(F.lit(1)).alias(INPUT_COUNT_COL)]
    per_row = {INPUT_COUNT_COL: F.lit(1).cast("bigint")}
    if event_time_column:
        ts = event_time.spark_ms(df, event_time_column, f".watermark({event_time_column!r}, ...)")
        carry.append(F.max(ts).alias(MAX_EVENT_TIME_COL))
        per_row[MAX_EVENT_TIME_COL] = ts
    if "carry" in inspect.signature(op.pre_aggregate).parameters:
        pre = op.pre_aggregate(df, tuple(carry))
        if pre is df:  # no aggregation: every row is one input row
            return df.withColumns(per_row), None
        if INPUT_COUNT_COL in pre.columns:
            return pre, None
    observed, obs = _observe(df, event_time_column, epoch)
    return op.pre_aggregate(observed), obs


def _session_time_zone(spark) -> str:
    # The zone Spark labels TIMESTAMP columns with when it hands them to Python as Arrow.
    return spark.conf.get("spark.sql.session.timeZone") or "UTC"


_TAGS: dict[tuple[int, int], list[int]] = {}


def _partition_tags(spark, parallelism: int) -> list[int]:
    """For each subtask i, an int that Spark's hash partitioning into `parallelism`
    partitions sends to partition i (Murmur3 with seed 42, as `repartition` uses; asked
    of Spark itself once per session and parallelism)."""
    from pyspark.sql import functions as F

    key = (id(spark), parallelism)
    if key not in _TAGS:
        probe = spark.range(0, 64 * parallelism).select(
            F.col("id").cast("int").alias("v"), F.pmod(F.hash(F.col("id").cast("int")), F.lit(parallelism)).alias("p"))
        first: dict[int, int] = {}
        for row in probe.collect():
            first.setdefault(int(row["p"]), int(row["v"]))
        if len(first) < parallelism:
            raise RuntimeError(f"no partition tag found for every one of {parallelism} subtasks")
        _TAGS[key] = [first[i] for i in range(parallelism)]
    return _TAGS[key]


_ROUTING: "weakref.WeakKeyDictionary[Any, dict[tuple, tuple[Any, Any]]]" = weakref.WeakKeyDictionary()
_ROUTING_LOCK = threading.Lock()


def _routing_columns(spark, key_columns: tuple[str, ...], parallelism: int, max_parallelism: int,
                     order: tuple[int, ...]):
    """(key group, partition tag): the columns that send each input row to its subtask.
    The key group is pmod(xxhash64(keys), max_parallelism); the tag makes Spark's hash
    partitioning into `parallelism` partitions put subtask order[i]'s rows in partition
    i. Partition i of the shuffle then holds exactly one subtask's rows, and a task runs
    for every partition, empty or not: every subtask runs every epoch (its state version
    advances in lockstep and it takes its part of every barrier) without marker rows, a
    union or a sort by group, which cost more than the state work on small epochs.

    Built once per session and shape, not per epoch: each function and operator of a
    classic session's Column is a py4j round trip (about 100 for these two, a quarter of
    an epoch's), and a small epoch is CPU-bound (bench/epoch_fixed_cost.py). A Column is
    an unresolved expression, so one serves every epoch's DataFrame."""
    from pyspark.sql import functions as F

    shape = (key_columns, parallelism, max_parallelism, order)
    with _ROUTING_LOCK:
        built = _ROUTING.setdefault(spark, {})
        if shape not in built:
            key_group = F.pmod(F.xxhash64(*[F.col(c) for c in key_columns]), F.lit(max_parallelism)).cast("int")
            subtask = F.floor(F.col(KEY_GROUP_COL) * parallelism / max_parallelism).cast("int")
            tags = _partition_tags(spark, parallelism)
            partition_of = {s: i for i, s in enumerate(order)}
            tag = F.element_at(F.array(*[F.lit(tags[partition_of[s]]) for s in range(parallelism)]), subtask + 1)
            built[shape] = (key_group, tag)
        return built[shape]


def run_epoch(spark, df, task: EpochTask | None, output: OutputStep, event_time_column: str | None,
              epoch: int, partition_order: Sequence[int] | None = None) -> EpochResult:
    """Run one epoch as one Spark job.

    `partition_order[i]` is the subtask that shuffle partition i (Spark task i) carries;
    None: subtask i. Why not always i: a Python worker keeps the stores of the subtasks it
    ran open (executor/kept_stores.py), and Spark hands a starting task the idle worker
    that was released first (its pool is a FIFO queue). Giving partition 0 to the subtask
    whose task ended first last epoch (`EpochResult.worker_order`), and so on, sends a
    subtask back to the worker that holds its store open, warm, whenever the tasks ask
    for their workers in partition order. They ask at about the same moment, so that is
    a race: on small epochs about half the subtask-epochs win it (bench/observations.md,
    2026-11-27); the others wait for the store and read it cold."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from sparkpoint.runtime.arrow_schema import arrow_schema

    if task is None:
        df, obs = _observe(df, event_time_column, epoch)
        return _run_stateless(df, obs, output, epoch)

    op = task.operator
    op.resolve_input_schema(arrow_schema(df.schema, _session_time_zone(spark)))
    pre, obs = _pre_aggregate_counting(op, df, event_time_column, epoch)
    if task.initial_state and getattr(op, "initial_state", None) is not None:
        pre = pre.unionByName(_initial_state_rows(spark, op, pre), allowMissingColumns=True)
    order = list(partition_order) if partition_order is not None else []
    if sorted(order) != list(range(task.parallelism)):
        order = list(range(task.parallelism))
    key_group, tag = _routing_columns(spark, tuple(op.key_columns), task.parallelism, task.max_parallelism,
                                      tuple(order))
    rows = pre.withColumn(KEY_GROUP_COL, key_group).repartition(task.parallelism, tag)
    in_schema = arrow_schema(rows.schema, _session_time_zone(spark))
    schema = output_schema_with_meta(op.output_schema)

    def apply_subtask(batches):
        from pyspark import TaskContext

        freeze_long_lived_objects()
        table = _table_of(batches, in_schema)
        yield from task.run(order[TaskContext.get().partitionId()], table).to_batches()

    out = rows.mapInArrow(apply_subtask, from_arrow_schema(schema)).toArrow()
    data, meta = split_meta(out, op.output_schema)
    if not meta:  # Spark ran no task at all: it knew the input was empty (see _no_rows_per_subtask)
        out = _no_rows_per_subtask(spark, rows, task.parallelism).mapInArrow(
            apply_subtask, from_arrow_schema(schema)).toArrow()
        data, meta = split_meta(out, op.output_schema)
    seen = {r[META_SUBTASK] for r in meta}
    missing = set(range(task.parallelism)) - seen
    if missing:  # cannot happen unless Spark dropped a group; never checkpoint over it
        raise RuntimeError(f"subtasks {sorted(missing)} did not report for epoch {epoch}")
    infos = {r[META_SUBTASK]: json.loads(r[META_INFO]) for r in meta}
    metrics = observed(obs) if obs is not None else None
    if metrics is not None:
        records, max_ts = int(metrics.get("n", 0)), metrics.get("max_ts")
    else:
        records = sum(int(i.get("input") or 0) for i in infos.values())
        max_ts = max((i["max_ts"] for i in infos.values() if i.get("max_ts") is not None), default=None)
    return EpochResult(
        output.map(data) if output.writer is None else None, records, max_ts,
        {r[META_SUBTASK]: r[META_ERROR] for r in meta},
        {r[META_SUBTASK]: r[META_ROWS] for r in meta},
        {r[META_SUBTASK]: r[META_MS] for r in meta},
        infos, [h for i in sorted(infos) for h in infos[i].get("sink", [])],
    )


def _initial_state_rows(spark, op, pre):
    """The operator's initial state as rows of its first epoch: the key columns (in the
    input's types), the initial row as one struct column, counted as no input record."""
    import pandas as pd
    from pyspark.sql import functions as F

    from sparkpoint.api.processor import INITIAL_STATE_COL

    initial = op.initial_state
    if not hasattr(initial, "sparkSession"):  # pandas or Arrow, given in the pipeline file
        initial = spark.createDataFrame(initial if isinstance(initial, pd.DataFrame) else initial.to_pandas())
    cols = [F.col(c).cast(pre.schema[c].dataType).alias(c) for c in op.key_columns]
    cols.append(F.struct(*[F.col(f"`{c}`") for c in initial.columns]).alias(INITIAL_STATE_COL))
    if INPUT_COUNT_COL in pre.columns:
        cols.append(F.lit(0).cast("bigint").alias(INPUT_COUNT_COL))
    return initial.select(*cols)


def _no_rows_per_subtask(spark, rows, parallelism: int):
    """`rows`' columns, no rows, in `parallelism` partitions that each run a task. When
    Spark can tell an epoch's input is empty it runs no task over it: the optimizer folds
    an empty local relation (what `createDataFrame([])` or `limit(0)` make, over Spark
    Connect too) through the repartition, and adaptive execution (on in sessions sparkpoint
    did not create) drops the stages after a shuffle that produced nothing. Every subtask
    must still take its part of every epoch; a filtered range is opaque to both."""
    from pyspark.sql import functions as F

    return (spark.range(0, parallelism, 1, parallelism).where(F.col("id") < 0)
            .select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in rows.schema.fields]))


def _table_of(batches, schema: pa.Schema) -> pa.Table:
    """The Arrow batches a mapInArrow task receives, as one table with `schema`'s fields,
    all nullable. Which fields the batches mark NOT NULL is the optimized plan's business:
    a filter on a column makes it NOT NULL there, while the DataFrame's schema, which
    `schema` comes from, still says nullable."""
    relaxed = pa.schema([f.with_nullable(True) for f in schema])
    return pa.Table.from_batches([pa.RecordBatch.from_arrays(b.columns, schema=relaxed) for b in batches],
                                 schema=relaxed)


def _run_stateless(df, obs, output: OutputStep, epoch: int) -> EpochResult:
    if output.writer is None:
        out = output.map(df.toArrow())
        m = observed(obs) or {}  # none: Spark ran no task over an input it knew was empty
        return EpochResult(out, int(m.get("n", 0)), m.get("max_ts"), {}, {}, {})
    from pyspark.sql.pandas.types import from_arrow_schema

    from sparkpoint.runtime.arrow_schema import arrow_schema

    in_schema = arrow_schema(df.schema, _session_time_zone(df.sparkSession))
    schema = output_schema_with_meta(pa.schema([]))

    def write_partition(batches):
        from pyspark import TaskContext

        freeze_long_lived_objects()
        table = _table_of(batches, in_schema)
        part = TaskContext.get().partitionId()
        _, handles = output(epoch, part, table)
        info = json.dumps({**where_am_i(), "sink": handles})
        yield from with_meta(None, schema, part, table.num_rows, 0, None, info).to_batches()

    meta = df.mapInArrow(write_partition, from_arrow_schema(schema)).toArrow().to_pylist()
    m = observed(obs) or {}
    handles = [h for r in sorted(meta, key=lambda r: r[META_SUBTASK]) for h in json.loads(r[META_INFO])["sink"]]
    return EpochResult(None, int(m.get("n", 0)), m.get("max_ts"), {}, {}, {}, {}, handles)


def restore_state(spark, task: RestoreTask, parallelism: int) -> dict[int, dict[str, Any]]:
    """One small Spark job: every subtask rebuilds its restored state on an executor.
    Returns each subtask's report (how, files, time). Raises CorruptSnapshotError when a
    file fails verification, StorageError when storage did not answer."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = output_schema_with_meta(pa.schema([]))

    def restore_subtask(table: pa.Table) -> pa.Table:
        freeze_long_lived_objects()
        return task(table)

    rows = spark.range(parallelism).select(F.col("id").cast("int").alias(SUBTASK_COL))
    meta = rows.groupBy(SUBTASK_COL).applyInArrow(restore_subtask, from_arrow_schema(schema)).toArrow().to_pylist()
    reports = {r[META_SUBTASK]: json.loads(r[META_INFO]) for r in meta}
    raise_restore_failure(reports)  # CorruptSnapshotError or StorageError, by the kind each task reported
    return reports


def split_meta(out: pa.Table, output_schema: pa.Schema) -> tuple[pa.Table, list[dict]]:
    """Separate the subtasks' output rows from the one meta row each subtask adds."""
    is_meta = pc.is_valid(out.column(META_SUBTASK))
    meta = out.filter(is_meta).select([META_SUBTASK, META_ROWS, META_MS, META_ERROR, META_INFO]).to_pylist()
    data = out.filter(pc.invert(is_meta)).drop_columns(META_NAMES)
    return (data.cast(output_schema) if data.schema != output_schema else data), meta
