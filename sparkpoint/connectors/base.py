"""What a source and a sink must do for exactly-once.

The driver's epoch loop owns positions: each epoch it asks every source to `plan`
a bounded slice from the current positions, reads the slice as a Spark DataFrame,
and after the epoch advances the positions to the slice's end. A checkpoint
records the positions at its barrier; a restore hands them back. So a source must
be *replayable*: `read(plan)` for the same plan returns the same records.

A sink gets each epoch's output as an Arrow table on the driver and follows a
two-phase commit bound to checkpoints:

    write_epoch(e, rows)      stage the epoch's rows (invisible to readers)
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


@dataclass
class SourceContext:
    spark: Any  # pyspark.sql.SparkSession; typed loosely so this module imports without Spark
    job_name: str


class Source(ABC):
    name: str = "source"

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

    def notify_checkpoint_complete(self, checkpoint_id: int, positions: Positions) -> None:
        """The checkpoint holding `positions` is durable (e.g. commit offsets to a
        consumer group). Must never raise into the job."""

    def close(self) -> None:
        pass


class Sink(ABC):
    name: str = "sink"

    def open(self, job_name: str) -> None:
        pass

    @abstractmethod
    def recover(self, handle: Mapping[str, Any] | None) -> None:
        """See the module docstring. `handle` is this sink's handle from the restored
        checkpoint, or None when starting fresh."""

    @abstractmethod
    def write_epoch(self, epoch: int, rows: pa.Table) -> None: ...

    @abstractmethod
    def pre_commit(self, checkpoint_id: int) -> Mapping[str, Any]: ...

    @abstractmethod
    def commit(self, handle: Mapping[str, Any]) -> None: ...

    def abort(self, handle: Mapping[str, Any]) -> None:
        """A pre-committed checkpoint failed. Its epochs stay staged and are folded into
        the next pre_commit, so nothing is lost and nothing published twice."""

    def close(self) -> None:
        pass
