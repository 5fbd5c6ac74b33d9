"""The aggregates every window kind computes: count, sum, min, max, avg of one value
column (`aggs=("count", "sum")`, `value_column=...`), or any aggregates written as
Spark SQL (`aggs=["count(*) AS n", "max(price) AS top"]`, aggfuncs/).

SQL aggregates keep their partials in an Arrow table beside the window records (one
row per window; `Windows.parts`), stored as one more entry per window (state.py); the
records keep the window's row count (for late-row accounting) and its bounds and
flags. The rest of this docstring is about the one-column aggregates.

Each window holds five running partials (rows, non-null values, sum, min, max), from
which every aggregate is read. They combine by addition and min/max, so Spark reduces
an epoch's rows to one partial per (key, pane or session) before they reach state, and
the worker merges partials without seeing rows. Nulls follow SQL: count counts rows,
sum/min/max/avg ignore null values, and are null in a window without any value.
Output columns carry the aggregates' names: count BIGINT, sum/min/max in the value
type (`value_type`, 'double' or 'bigint'), avg DOUBLE.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api.aggfuncs import AggregateSet
from sparkpoint.api.aggfuncs.stored import SLOT, merge_stored
from sparkpoint.api.aggregate import P_COUNT, P_MAX, P_MIN, P_NVALUES, P_SUM, identities, parse_value_type
from sparkpoint.errors import ConfigError

WINDOW_AGGREGATES = ("count", "sum", "min", "max", "avg")
PARTIALS = (P_COUNT, P_NVALUES, P_SUM, P_MIN, P_MAX)
# Record fields of the partials (state/codec.py's FixedWidthCodec layout).
FIELDS = ("count", "nvalues", "sum", "min", "max")


class WindowAggregates:
    def __init__(self, operator: str, aggs: Sequence[str], value_column: str | None,
                 value_type: str | pa.DataType):
        aggs = tuple(aggs)
        self.sql: AggregateSet | None = None
        if aggs and all(a not in WINDOW_AGGREGATES for a in aggs) and value_column is None:
            # Spark SQL aggregates; a hidden count(*) first counts each window's rows.
            self.sql = AggregateSet(operator, ["count(*) AS __rows", *aggs])
            self.names = self.sql.names[1:]
            self.value_column = None
            self.value_type = parse_value_type(value_type)
            self.kind = "i8"
            return
        unknown = [a for a in aggs if a not in WINDOW_AGGREGATES]
        if not aggs or unknown or len(set(aggs)) != len(aggs):
            raise ConfigError(f"{operator}: aggs {list(aggs)} must name each of {list(WINDOW_AGGREGATES)} at most "
                              "once, and at least one, with value_column=...; or be Spark SQL aggregates such as "
                              "['count(*) AS n', 'max(price) AS top'] without value_column")
        if set(aggs) - {"count"} and value_column is None:
            raise ConfigError(f"{operator}: aggs {list(aggs)} need value_column=... (the column they aggregate)")
        self.names = aggs
        self.value_column = value_column
        self.value_type = parse_value_type(value_type)
        self.kind = "f8" if pa.types.is_floating(self.value_type) else "i8"

    @property
    def count_column(self) -> str:
        """The partial column holding each partial's row count."""
        return P_COUNT if self.sql is None else self.sql.part_names[0]

    def record_fields(self) -> list[tuple[str, str]]:
        if self.sql is not None:
            return [("count", "i8")]
        return [("count", "i8"), ("nvalues", "i8"), ("sum", self.kind), ("min", self.kind), ("max", self.kind)]

    def output_fields(self) -> list[pa.Field]:
        if self.sql is not None:
            return self.sql.output_fields()[1:]
        types = {"count": pa.int64(), "sum": self.value_type, "min": self.value_type, "max": self.value_type,
                 "avg": pa.float64()}
        return [pa.field(a, types[a]) for a in self.names]

    # -- Spark side -------------------------------------------------------------------
    def spark_partials(self) -> list[Any]:
        """The partial aggregate Columns of one group of rows."""
        from pyspark.sql import functions as F

        if self.sql is not None:
            return self.sql.spark_partials()
        partials = [F.count(F.lit(1)).alias(P_COUNT)]
        if self.value_column is not None:
            v = F.col(self.value_column).cast("double" if self.kind == "f8" else "bigint")
            partials += [F.count(v).alias(P_NVALUES), F.sum(v).alias(P_SUM), F.min(v).alias(P_MIN),
                         F.max(v).alias(P_MAX)]
        return partials

    # -- worker side ------------------------------------------------------------------
    def resolve_from_spark(self, spark_schema: Any) -> None:
        if self.sql is not None:
            self.sql.resolve_from_spark(spark_schema)

    def resolve_input_schema(self, schema: pa.Schema) -> None:
        if self.sql is not None and not self.sql.resolved:
            self.sql.resolve_from_input(schema)

    def partial_columns(self, rows: pa.Table) -> dict[str, Any]:
        """The five partial columns of `rows`: Spark's partials as they came, or one
        partial per raw row (the test harness hands rows unreduced)."""
        if self.sql is not None:
            if all(n in rows.column_names for n in self.sql.part_names):
                if not self.sql.resolved:
                    self.sql.resolve_from_partials(rows.schema)
                return {f.name: rows.column(f.name).cast(f.type) for f in self.sql.part_schema()}
            return self.sql.row_partials(rows)
        lo, hi = identities(self.value_type)
        n = rows.num_rows
        if P_COUNT in rows.column_names:
            count = rows.column(P_COUNT).cast(pa.int64())
            if P_NVALUES in rows.column_names:
                cols = {P_COUNT: count, P_NVALUES: rows.column(P_NVALUES).cast(pa.int64()),
                        P_SUM: rows.column(P_SUM).cast(self.value_type),
                        P_MIN: rows.column(P_MIN).cast(self.value_type),
                        P_MAX: rows.column(P_MAX).cast(self.value_type)}
            else:  # count only: no value column was aggregated
                cols = {P_COUNT: count, P_NVALUES: pa.array(np.zeros(n, np.int64)),
                        P_SUM: pa.nulls(n, self.value_type), P_MIN: pa.nulls(n, self.value_type),
                        P_MAX: pa.nulls(n, self.value_type)}
        else:
            if self.value_column is None:
                v = pa.nulls(n, self.value_type)
            else:
                v = rows.column(self.value_column).cast(self.value_type)
            cols = {P_COUNT: pa.array(np.ones(n, dtype=np.int64)), P_NVALUES: pc.cast(pc.is_valid(v), pa.int64()),
                    P_SUM: v, P_MIN: v, P_MAX: v}
        cols[P_SUM] = pc.fill_null(cols[P_SUM], pa.scalar(0, self.value_type))
        cols[P_MIN] = pc.fill_null(cols[P_MIN], pa.scalar(lo, self.value_type))
        cols[P_MAX] = pc.fill_null(cols[P_MAX], pa.scalar(hi, self.value_type))
        return cols

    def combine(self, table: pa.Table, by: list[str]) -> pa.Table:
        """One row per distinct `by`, partials combined."""
        if self.sql is not None:
            return self.sql.combine(table, by)
        grouped = table.group_by(by, use_threads=False).aggregate(
            [(P_COUNT, "sum"), (P_NVALUES, "sum"), (P_SUM, "sum"), (P_MIN, "min"), (P_MAX, "max")])
        return grouped.rename_columns({f"{P_COUNT}_sum": P_COUNT, f"{P_NVALUES}_sum": P_NVALUES,
                                       f"{P_SUM}_sum": P_SUM, f"{P_MIN}_min": P_MIN, f"{P_MAX}_max": P_MAX})

    def fill(self, records: np.ndarray, table: pa.Table) -> pa.Table | None:
        """Copy `table`'s partial columns into the record fields; the SQL partials (one
        row per record), or None."""
        if self.sql is not None:
            records["count"] = table.column(self.count_column).to_numpy()
            return table.select(self.sql.part_names)
        for field, col in zip(FIELDS, PARTIALS):
            records[field] = table.column(col).to_numpy()

    def add(self, into: np.ndarray, other: np.ndarray) -> None:
        """`into` += `other`, record by record (same length)."""
        into["count"] += other["count"]
        if self.sql is not None:
            return
        into["nvalues"] += other["nvalues"]
        into["sum"] += other["sum"]
        into["min"] = np.minimum(into["min"], other["min"])
        into["max"] = np.maximum(into["max"], other["max"])

    def merge_parts(self, new: pa.Table, stored: list[bytes | None], what: str) -> pa.Table:
        """`new` partials (one row per window) after the stored ones of the same windows."""
        return merge_stored(self.sql, new, stored, what)

    def fold_parts(self, parts: pa.Table, slots: np.ndarray) -> pa.Table:
        """One row per slot (0..max) of `parts`' rows combined in row order."""
        merged = self.sql.combine(parts.append_column(SLOT, pa.array(slots, pa.int64())), [SLOT])
        return merged.take(pc.sort_indices(merged.column(SLOT))).select(self.sql.part_names)

    def output_columns(self, records: np.ndarray, parts: pa.Table | None = None) -> list[pa.Array]:
        if self.sql is not None:
            return [col.cast(f.type) for f, col in zip(self.output_fields(), self.sql.results(parts)[1:])]
        no_values = records["nvalues"] == 0
        out = []
        for a in self.names:
            if a == "count":
                out.append(pa.array(records["count"], type=pa.int64()))
            elif a == "avg":
                with np.errstate(invalid="ignore", divide="ignore"):
                    avg = records["sum"].astype(np.float64) / records["nvalues"]
                out.append(pa.array(avg, type=pa.float64(), mask=no_values))
            else:
                out.append(pa.array(records[a], type=self.value_type, mask=no_values))
        return out
