"""Several aggregates at once: their partials in Spark, their merge and result in Arrow.

Each aggregate keeps a few partial columns (`__a<i>_<role>`) that combine without the
rows they came from:
  n  rows or values counted (count, avg, first/last)      combined by sum
  s  a sum (sum; avg, as DOUBLE)                          sum, null while no value
  v  min / max; first / last value                        min / max; the first / last
                                                          row (in input order) with n > 0
  l  a list (collect_list, percentile_approx)             concatenated in input order
     or a set (collect_set, count(DISTINCT), approx_count_distinct)   united
The n/s/v partials are *splittable*: Spark reduces each epoch to one row per group
before they reach state, and state holds a few fixed values per group. The l partials
are *buffered*: Spark collects each epoch's values per group, and state holds every
value (or distinct value) of the group until its result is due. Merging state with an
epoch is `combine` over the stored row followed by the epoch's, so "first" and the
order of collect_list follow arrival order, as Spark's first/last and collect_list do
within one batch job.

Results follow Spark: count is never null; sum/min/max/avg/first/last are null without
a value; collect_* give [] ; avg is DOUBLE; approx_count_distinct is exact (state holds
the set, so the count is within any error bound Spark allows); percentile_approx is
computed on every value, which is what Spark's sketch gives while it is exact (up to
its accuracy, 10 000 values by default) and the best any sketch can approach after.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api.aggfuncs.spec import AggCall, parse_agg
from sparkpoint.errors import ConfigError

_COUNTS = ("count_rows", "count", "count_distinct", "approx_count_distinct")
_SETS = ("collect_set", "count_distinct", "approx_count_distinct")
_LISTS = ("collect_list", "percentile_approx")
_ROLES = {"count_rows": "n", "count": "n", "sum": "s", "avg": "sn", "min": "v", "max": "v", "first": "vn",
          "last": "vn", "collect_list": "l", "percentile_approx": "l", "collect_set": "l", "count_distinct": "l",
          "approx_count_distinct": "l"}
BUFFERED = _SETS + _LISTS


def part_name(i: int, role: str) -> str:
    return f"__a{i}_{role}"


class AggregateSet:
    """The aggregates of one step, from Spark SQL texts (see spec.py)."""

    def __init__(self, what: str, aggs: Sequence[str]):
        if isinstance(aggs, str) or not aggs:
            raise ConfigError(f"{what}: aggs must be a non-empty list of aggregates, e.g. "
                              "['count(*) AS bids', 'max(price) AS top']")
        self.what = what
        self.calls = [parse_agg(a, what) for a in aggs]
        names = [c.alias for c in self.calls]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"{what}: several aggregates are named {dup}; give each its own name with AS")
        self.names = tuple(names)
        self.parts = [(i, r) for i, c in enumerate(self.calls) for r in _ROLES[c.func]]
        self.part_names = [part_name(i, r) for i, r in self.parts]
        self._types: dict[str, pa.DataType] | None = None

    @property
    def splittable(self) -> list[str]:
        return [c.alias for c in self.calls if c.func not in BUFFERED]

    @property
    def buffered(self) -> list[str]:
        return [c.alias for c in self.calls if c.func in BUFFERED]

    # -- types ---------------------------------------------------------------------------
    @property
    def resolved(self) -> bool:
        return self._types is not None

    def resolve_from_input(self, schema: pa.Schema) -> None:
        """Learn the partial types from the input's column types, where every argument
        is a plain column (else `resolve_from_partials` learns them from Spark)."""
        types: dict[str, pa.DataType] = {}
        for (i, role), name in zip(self.parts, self.part_names):
            call = self.calls[i]
            arg = call.arg_column() if call.args else None
            if call.args and (arg is None or arg not in schema.names):
                return
            t = schema.field(arg).type if arg else None
            types[name] = _part_type(call, role, t)
        self._types = types

    def resolve_from_partials(self, schema: pa.Schema) -> None:
        """Learn the partial types from Spark's pre-aggregated columns."""
        missing = [n for n in self.part_names if n not in schema.names]
        if missing:
            raise ConfigError(f"{self.what}: the pre-aggregated rows lack the partial columns {missing}")
        self._types = {n: _storable(schema.field(n).type) for n in self.part_names}

    def part_schema(self) -> pa.Schema:
        if self._types is None:
            raise ConfigError(f"{self.what}: the types of its aggregates are not known yet; Spark learns them "
                              "when it pre-aggregates the first epoch (in the test harness give plain columns)")
        return pa.schema([pa.field(n, self._types[n]) for n in self.part_names])

    def output_fields(self) -> list[pa.Field]:
        types = self.part_schema()
        out = []
        for i, c in enumerate(self.calls):
            if c.func in _COUNTS:
                t = pa.int64()
            elif c.func == "avg":
                t = pa.float64()
            elif c.func in ("sum",):
                t = types.field(part_name(i, "s")).type
            elif c.func in ("min", "max", "first", "last"):
                t = types.field(part_name(i, "v")).type
            elif c.func in ("collect_list", "collect_set"):
                t = types.field(part_name(i, "l")).type
            else:  # percentile_approx
                item = types.field(part_name(i, "l")).type.value_type
                t = pa.list_(item) if c.percentage_is_array else item
            out.append(pa.field(c.alias, t))
        return out

    # -- Spark side --------------------------------------------------------------------
    def spark_partials(self) -> list[Any]:
        """The partial aggregate Columns of one group of rows (Spark evaluates every
        argument and FILTER condition itself)."""
        from pyspark.sql import functions as F

        cols = []
        for (i, role), name in zip(self.parts, self.part_names):
            cols.append(F.expr(_partial_sql(self.calls[i], role)).alias(name))
        return cols

    def resolve_from_spark(self, spark_schema: Any) -> None:
        from pyspark.sql.pandas.types import to_arrow_type

        fields = {f.name: f.dataType for f in spark_schema.fields}
        self.resolve_from_partials(pa.schema([pa.field(n, _spark_to_arrow(to_arrow_type, fields[n]))
                                              for n in self.part_names if n in fields]))

    # -- worker side ---------------------------------------------------------------------
    def row_partials(self, rows: pa.Table) -> dict[str, Any]:
        """The partial columns of raw rows, one partial per row (the test harness hands
        rows without Spark): every argument must be a column, every FILTER condition a
        BOOLEAN column."""
        if not self.resolved:
            self.resolve_from_input(rows.schema)
        types = self.part_schema()
        n = rows.num_rows
        out: dict[str, Any] = {}
        for (i, role), name in zip(self.parts, self.part_names):
            call = self.calls[i]
            keep = np.ones(n, dtype=bool)
            if call.condition is not None:
                col = call.condition_column()
                if col is None or col not in rows.column_names:
                    raise ConfigError(f"{self.what}: {call.text!r} filters on {call.condition!r}, which only Spark "
                                      "evaluates; to run it without Spark, compute the condition as a BOOLEAN "
                                      "column and filter on that column")
                keep = pc.fill_null(rows.column(col), False).to_numpy(zero_copy_only=False).astype(bool)
            v = None
            if call.args:
                col = call.arg_column()
                if col is None or col not in rows.column_names:
                    raise ConfigError(f"{self.what}: {call.text!r} aggregates {call.arg!r}, which only Spark "
                                      "evaluates; to run it without Spark, compute it as a column first")
                v = rows.column(col).combine_chunks() if isinstance(rows.column(col), pa.ChunkedArray) \
                    else rows.column(col)
            valid = keep & (np.ones(n, dtype=bool) if v is None else v.is_valid().to_numpy(zero_copy_only=False))
            t = types.field(name).type
            if role == "n":
                counted = keep if call.func in ("count_rows", "first", "last") and not call.ignore_nulls else valid
                out[name] = pa.array(counted.astype(np.int64))
            elif role == "s":
                out[name] = pc.if_else(pa.array(valid), v.cast(t), pa.scalar(None, t))
            elif role == "v":
                out[name] = pc.if_else(pa.array(keep), v.cast(t), pa.scalar(None, t))
            else:  # a list of the row's value, or none
                offsets = np.concatenate([[0], np.cumsum(valid)]).astype(np.int32)
                values = v.filter(pa.array(valid)).cast(t.value_type)
                out[name] = pa.ListArray.from_arrays(pa.array(offsets), values)
        return out

    def combine(self, table: pa.Table, by: list[str]) -> pa.Table:
        """One row per distinct `by` (in order of first appearance), its partials
        combined in row order. Other columns are dropped."""
        n = table.num_rows
        rows = pa.array(np.arange(n, dtype=np.int64))
        base = table.select(by).append_column("__row", rows)
        specs: list[tuple] = [("__row", "min"), ("__row", "list")]
        for (i, role), name in zip(self.parts, self.part_names):
            func = self.calls[i].func
            if role == "n":
                specs.append((name, "sum"))
            elif role == "s":
                specs.append((name, "sum", pc.ScalarAggregateOptions(min_count=1)))
            elif role == "v" and func in ("min", "max"):
                specs.append((name, func))
            elif role == "v":  # first/last: the first/last row that counted
                at = pc.if_else(pc.greater(table.column(part_name(i, "n")), 0), rows, pa.scalar(None, pa.int64()))
                base = base.append_column(name + "__at", at)
                specs.append((name + "__at", "min" if func == "first" else "max"))
            if role in ("n", "s") or (role == "v" and func in ("min", "max")):
                base = base.append_column(name, table.column(name))
        grouped = base.group_by(by, use_threads=False).aggregate(specs)
        grouped = grouped.take(pc.sort_indices(grouped.column("__row_min")))
        first_rows = grouped.column("__row_min").to_numpy()
        gid = np.empty(n, dtype=np.int64)
        members = grouped.column("__row_list").combine_chunks()
        gid[pc.list_flatten(members).to_numpy()] = pc.list_parent_indices(members).to_numpy()
        out = grouped.select(by)
        for (i, role), name in zip(self.parts, self.part_names):
            func = self.calls[i].func
            if role == "n":
                col = grouped.column(f"{name}_sum").cast(pa.int64())
            elif role == "s":
                col = grouped.column(f"{name}_sum").cast(table.schema.field(name).type)
            elif role == "v" and func in ("min", "max"):
                col = grouped.column(f"{name}_{func}").cast(table.schema.field(name).type)
            elif role == "v":
                at = grouped.column(f"{name}__at_{'min' if func == 'first' else 'max'}")
                col = table.column(name).take(at)
            else:
                col = _combine_lists(table.column(name), gid, len(first_rows), func in _SETS)
            out = out.append_column(name, col)
        return out

    def results(self, parts: pa.Table) -> list[pa.Array]:
        """The aggregates' values from combined partials, in the order given."""
        out = []
        for i, c in enumerate(self.calls):
            def part(role: str) -> pa.ChunkedArray | pa.Array:
                return parts.column(part_name(i, role))

            if c.func in ("count_rows", "count"):
                col = pc.fill_null(part("n"), 0)
            elif c.func in ("count_distinct", "approx_count_distinct"):
                col = pc.fill_null(pc.list_value_length(part("l")), 0).cast(pa.int64())
            elif c.func == "sum":
                col = part("s")
            elif c.func == "avg":
                nv = part("n")
                col = pc.if_else(pc.greater(pc.fill_null(nv, 0), 0),
                                 pc.divide(part("s").cast(pa.float64()), pc.cast(nv, pa.float64())),
                                 pa.scalar(None, pa.float64()))
            elif c.func in ("min", "max", "first", "last"):
                col = part("v")
            elif c.func in ("collect_list", "collect_set"):
                lists = part("l")
                col = pc.if_else(pc.is_null(lists), pa.scalar([], lists.type), lists)
            else:
                col = _percentiles(part("l"), c)
            out.append(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
        return out


# -- helpers ------------------------------------------------------------------------------
def _condition(call: AggCall) -> str:
    return f" FILTER (WHERE {call.condition})" if call.condition is not None else ""


def _partial_sql(call: AggCall, role: str) -> str:
    x, f = call.arg, _condition(call)
    if role == "n":
        counts_rows = call.func == "count_rows" or (call.func in ("first", "last") and not call.ignore_nulls)
        return f"count(1){f}" if counts_rows else f"count({x}){f}"
    if role == "s":
        return f"sum(CAST({x} AS DOUBLE)){f}" if call.func == "avg" else f"sum({x}){f}"
    if role == "v":
        if call.func in ("first", "last"):
            return f"{call.func}({x}, {'true' if call.ignore_nulls else 'false'}){f}"
        return f"{call.func}({x}){f}"
    return f"{'collect_set' if call.func in _SETS else 'collect_list'}({x}){f}"


def _part_type(call: AggCall, role: str, t: pa.DataType | None) -> pa.DataType:
    if role == "n":
        return pa.int64()
    if role == "s":
        if call.func == "avg":
            return pa.float64()
        if pa.types.is_integer(t):
            return pa.int64()
        if pa.types.is_floating(t):
            return pa.float64()
        return t
    if role == "v":
        return t
    return pa.list_(t)


def _storable(t: pa.DataType) -> pa.DataType:
    return pa.list_(t.value_type) if pa.types.is_large_list(t) else t


def _spark_to_arrow(to_arrow_type: Any, spark_type: Any) -> pa.DataType:
    try:
        return to_arrow_type(spark_type, timestamp_utc=True)
    except TypeError:
        return to_arrow_type(spark_type)


def _combine_lists(col: pa.ChunkedArray | pa.Array, gid: np.ndarray, groups: int, distinct: bool) -> pa.Array:
    """Per group, the concatenation of its rows' lists in row order (the distinct values
    when `distinct`); nulls inside lists are dropped (Spark's collect_* skip them)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    values = pc.list_flatten(arr)
    owner = gid[pc.list_parent_indices(arr).to_numpy()] if len(values) else np.zeros(0, np.int64)
    t = pa.table({"g": pa.array(owner, pa.int64()), "v": values}).filter(pc.is_valid(values))
    if distinct and t.num_rows:
        t = t.group_by(["g", "v"], use_threads=False).aggregate([])
    t = t.take(pc.sort_indices(t.column("g")))  # stable: keeps row order within a group
    counts = np.bincount(t.column("g").to_numpy(), minlength=groups) if t.num_rows else np.zeros(groups, np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), t.column("v").combine_chunks().cast(arr.type.value_type))


def _percentiles(lists: pa.ChunkedArray | pa.Array, call: AggCall) -> pa.Array:
    """Spark's percentile_approx where its summary is exact: the value at rank
    ceil(p * n) in sorted order (the smallest for p = 0)."""
    item = lists.type.value_type
    out = []
    for values in lists.to_pylist():
        vs = sorted(v for v in (values or []) if v is not None)
        if not vs:
            out.append(None)
            continue
        picked = [vs[min(max(math.ceil(p * len(vs)) - 1, 0), len(vs) - 1)] for p in call.percentages]
        out.append(picked if call.percentage_is_array else picked[0])
    return pa.array(out, pa.list_(item) if call.percentage_is_array else item)
