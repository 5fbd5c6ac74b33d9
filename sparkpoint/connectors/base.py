"""What a source and a sink must do for exactly-once.

The driver's epoch loop owns positions: each epoch it asks every source to `plan`
a bounded slice from the current positions, reads the slice as a Spark DataFrame,
and after the epoch advances the positions to the slice's end. A checkpoint
records the positions at its barrier; a restore hands them back. So a source must
be *replayable*: `read(plan)` for the same plan returns the same records.

A sink follows a two-phase commit bound to checkpoints. Output never funnels through
the driver when the sink has an `epoch_writer()`: the writer is shipped to Spark's
executors, each task stages its own rows there and returns small JSON handles, and
the driver only records those handles (`stage_epoch`). A sink without a writer gets
each epoch's rows collected on the driver (`write_epoch`).

    epoch_writer().write(e, part, rows)   on an executor: stage rows (invisible to
                              readers) under a name unique to this attempt; return
                              JSON handles of what was staged
    stage_epoch(e, handles)   on the driver: the handles of epoch e's winning tasks
    write_epoch(e, rows)      (sinks without a writer) stage the epoch's rows
    pre_commit(cid)           at the barrier: seal everything staged since the last
                              barrier; returns a JSON handle saying what to commit
    commit(handle)            when checkpoint cid completes: publish; idempotent
    recover(handle | None)    on restore: re-run commit(handle) of the restored
                              checkpoint (a crash may have hit between `_metadata`
                              and commit), then abort everything else staged.

Positions and handles are JSON-compatible; nothing is pickled.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Mapping

import pyarrow as pa

# split id -> position (an int offset for most sources; JSON-compatible)
Positions = dict[str, Any]


@dataclass(frozen=True)
class SlicePlan:
    """The records one epoch reads: for each split, [start, end) positions."""

    start: Positions
    end: Positions

    @property
    def empty(self) -> bool:
        return all(self.start.get(s) == e for s, e in self.end.items())


def empty_frame(spark: Any, struct: Any):
    """A DataFrame of no rows with the columns of `struct` (a StructType), for an empty
    slice. Not `createDataFrame([])`: over Spark Connect that is an empty local relation,
    which Spark's optimizer folds through the epoch's repartition, so no task runs and
    the subtasks never take their part of the epoch. An empty range stays a scan."""
    from pyspark.sql import functions as F

    return spark.range(0, 0, 1, 1).select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in struct.fields])


@dataclass
class SourceContext:
    spark: Any  # pyspark.sql.SparkSession; typed loosely so this module imports without Spark
    job_name: str


class Source(ABC):
    name: str = "source"
    # Bad input records refused so far in this run, each counted once (shown in progress).
    malformed_records: int = 0

    def open(self, ctx: SourceContext) -> None:
        """Connect. Called once per run, before `initial_positions`."""

    @abstractmethod
    def initial_positions(self) -> Positions:
        """Where to start when there is no checkpoint (e.g. earliest / latest)."""

    def discover(self, positions: Positions) -> Positions:
        """Add splits that appeared since (new files, new partitions) at their start
        position; return the full positions map. Default: unchanged."""
        return positions

    @abstractmethod
    def plan(self, positions: Positions) -> SlicePlan:
        """The next slice from `positions`, bounded by the source's per-epoch limits."""

    def plan_size(self, plan: SlicePlan) -> int | None:
        """How many units (records, files) `plan` reads, for epochs sized by time; None
        when the source cannot say (its epochs are then never cut). Default: positions
        that are record offsets, as Kafka's and the generator's are."""
        try:
            return sum(max(0, int(e) - int(plan.start[s])) for s, e in plan.end.items())
        except (KeyError, TypeError, ValueError):
            return None

    def shrink(self, plan: SlicePlan, units: int) -> SlicePlan:
        """The first `units` of `plan` (see `plan_size`), spread over the splits in
        proportion to what each has, at least one record for each split that has any, so
        no split's event time falls behind. Default: offset positions."""
        sizes = {s: max(0, int(e) - int(plan.start[s])) for s, e in plan.end.items()}
        total = sum(sizes.values())
        if units >= total:
            return plan
        end = {s: int(plan.start[s]) + (max(1, n * units // total) if n else 0) for s, n in sizes.items()}
        return SlicePlan(dict(plan.start), end)

    @abstractmethod
    def read(self, plan: SlicePlan):  # -> pyspark.sql.DataFrame
        """The slice's records as a DataFrame. Same plan, same records."""

    @property
    def schema(self) -> str:
        """DDL of the records `read` returns."""
        raise NotImplementedError

    def is_exhausted(self, positions: Positions) -> bool:
        """True once a bounded source has nothing more to read. Unbounded: False."""
        return False

    def lag(self, positions: Positions) -> Mapping[str, int]:
        """Records behind per split, for progress and metrics (best effort)."""
        return {}

    def bind_metrics(self, registry: Any) -> None:
        """Register the source's metrics on the job's Prometheus registry (the one the
        metrics endpoint serves). Default: the source has none."""

    def notify_checkpoint_complete(self, checkpoint_id: int, positions: Positions) -> None:
        """The checkpoint holding `positions` is durable (e.g. commit offsets to a
        consumer group). Must never raise into the job."""

    def close(self) -> None:
        pass


class EpochWriter(ABC):
    """The executor side of a sink: picklable, holds no open resources between calls.

    `write` may run more than once for the same (epoch, part) (Spark retries tasks,
    and a task whose executor died runs again elsewhere): each attempt must stage
    under a name of its own, and only the handles the driver receives are committed;
    the rest are removed by `Sink.recover` or garbage collection."""

    @abstractmethod
    def write(self, epoch: int, part: int, rows: pa.Table) -> list[dict[str, Any]]:
        """Stage `rows` of `epoch` from task `part` durably; return JSON handles (may be
        empty when there are no rows)."""


class Sink(ABC):
    name: str = "sink"
    # How a user reads the committed output (printed beside `location` when a run ends).
    read_hint: str = "committed output only"

    def open(self, job_name: str) -> None:
        pass

    @property
    def location(self) -> str | None:
        """Where committed output is read (shown to the user); None if not a place."""
        return None

    def use_job_storage(self, staging_dir: str, options: Mapping[str, Any]) -> None:
        """The runtime offers a durable directory beside the job's checkpoints for sinks
        that stage rows between pre-commit and commit. Default: not needed."""

    def savepoint_handle(self, handle: Mapping[str, Any], savepoint_url: str,
                         options: Mapping[str, Any]) -> Mapping[str, Any]:
        """`handle` (from `pre_commit`) is part of the savepoint at `savepoint_url`. A sink
        whose staged output lives with the job's checkpoints, not beside its output,
        copies what the handle needs into the savepoint and names the copies relative to
        it, so a new job started from a moved savepoint still finds them. Default: as is."""
        return handle

    def use_savepoint(self, savepoint_url: str, options: Mapping[str, Any]) -> None:
        """The job starts from the savepoint at `savepoint_url`; called before `recover`
        gets that savepoint's handle. Default: nothing to do."""

    @property
    def needs_epoch_plans(self) -> bool:
        """True when output this sink published cannot be withdrawn by a restore to an older
        checkpoint (a committed Kafka transaction): the runtime then logs each epoch's plan
        so that epochs published past the restored checkpoint run again exactly as first
        planned (runtime/epoch_replay.py). Default: False; the sink withdraws output
        committed after the restored checkpoint in `recover`, as Parquet and Delta do."""
        return False

    def published_epoch(self) -> int | None:
        """After `recover`: the last epoch whose output this sink published on the restored
        checkpoint's line of epochs, None if unknown or none. Epochs after the restored
        one up to it are replayed as first planned, and their output is not handed to the
        sink again (no `write_epoch`/`stage_epoch` for them). The handle of a barrier after
        them must still count them as published. Only asked of sinks that `needs_epoch_plans`."""
        return None

    def committed_epochs(self) -> list[int]:
        """Epochs whose output is committed (to refuse mixing two runs' output)."""
        return []

    def epoch_writer(self) -> EpochWriter | None:
        """The executor-side writer, or None to receive rows on the driver (`write_epoch`)."""
        return None

    def stage_epoch(self, epoch: int, handles: list[dict[str, Any]]) -> None:
        """Driver: what the executors staged for `epoch` (called once per epoch, also
        with no handles). Only for sinks with an `epoch_writer`."""
        raise NotImplementedError(f"sink {self.name} has no epoch_writer")

    @abstractmethod
    def recover(self, handle: Mapping[str, Any] | None) -> None:
        """See the module docstring. `handle` is this sink's handle from the restored
        checkpoint, or None when starting fresh."""

    def write_epoch(self, epoch: int, rows: pa.Table) -> None:
        """Driver-side staging, for sinks without an `epoch_writer`."""
        raise NotImplementedError(f"sink {self.name} stages from executors (epoch_writer)")

    @abstractmethod
    def pre_commit(self, checkpoint_id: int) -> Mapping[str, Any]: ...

    @abstractmethod
    def commit(self, handle: Mapping[str, Any]) -> None: ...

    def abort(self, handle: Mapping[str, Any]) -> None:
        """A pre-committed checkpoint failed. Its epochs stay staged and are folded into
        the next pre_commit, so nothing is lost and nothing published twice."""

    def close(self) -> None:
        pass
