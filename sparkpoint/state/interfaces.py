"""The contract between the runtime (Spark glue) and keyed stateful operators.

Per epoch and per stateful step, the runtime:
  1. runs `operator.pre_aggregate(df)` in Spark (e.g. count/sum per key per window),
  2. adds `__kg = pmod(xxhash64(key columns), max_parallelism)` and
     `__subtask = __kg * parallelism // max_parallelism` (Flink's key-group ranges),
     plus one marker row per subtask so every subtask runs every epoch,
  3. `groupBy("__subtask").applyInArrow(...)`; inside the Python worker, for subtask i
     (sparkpoint/runtime/executor/subtask.py):
       store = the local store brought to epoch - 1 (used as is, caught up from change
               logs, or rebuilt from checkpoint storage: local disk is only a cache)
       if Spark re-ran this task after it committed: return the stored output
       out = operator.apply(store, rows_without_marker, ctx)
       the epoch's change log -> checkpoint storage; then ONE atomic local commit of
       state + epoch marker + output
  4. the driver records each subtask's lineage (snapshot + change logs) and hands it
     to the next epoch; a checkpoint's state handles are those lineages.

Operators are shipped to Spark's Python workers with cloudpickle (that is Spark's
own mechanism, code not data); they must hold no open resources between epochs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import pyarrow as pa

SUBTASK_COL = "__subtask"
KEY_GROUP_COL = "__kg"
MARKER_COL = "__marker"  # True on the one synthetic row per subtask; dropped before apply
# Carried through pre_aggregate: input rows behind each row, and their max event time (ms).
INPUT_COUNT_COL = "__n"
MAX_EVENT_TIME_COL = "__max_ts"
CARRIED_COLS = (INPUT_COUNT_COL, MAX_EVENT_TIME_COL)


@dataclass(frozen=True)
class EpochContext:
    epoch: int
    subtask: int
    parallelism: int
    max_parallelism: int
    # Event-time watermark in effect for this epoch (ms); None when no event time is used.
    watermark_ms: int | None
    processing_time_ms: int
    # End of input: fire every pending window / timer.
    final: bool = False
    # Set when a checkpoint barrier sits at the end of this epoch.
    checkpoint_id: int | None = None


class StatefulOperator(ABC):
    """A keyed stateful step."""

    name: str
    key_columns: list[str]

    @property
    @abstractmethod
    def output_schema(self) -> pa.Schema:
        """Schema of the rows `apply` returns (also the sink's input schema)."""

    def resolve_input_schema(self, schema: pa.Schema) -> None:
        """Called on the driver with the Arrow schema of the step's input before
        `output_schema` is read (operators take their key types from it)."""

    def pre_aggregate(self, df, carry=()):  # pyspark DataFrame -> DataFrame
        """Reduce the epoch's rows in Spark before they touch state. Must keep
        `key_columns`. Default: no pre-aggregation.

        `carry`: aggregate Columns of the runtime's own (how many input rows and their
        latest event time each output row stands for); an operator that aggregates adds
        them to its aggregation, so the runtime learns them without another pass over the
        epoch. An operator that does not aggregate ignores them."""
        return df

    @abstractmethod
    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        """Apply one subtask's (pre-aggregated) rows of one epoch to `store`, return output rows.
        `store` is a `sparkpoint.state.store.SubtaskStateStore`. Reads see this epoch's own
        writes; writes become durable only in `commit_epoch`, all at once."""
