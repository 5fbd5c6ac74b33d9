"""`KeyedAggregate`: running aggregates per key, in update mode.

Two ways to name the aggregates:
  - `aggs=["count(*) AS bids", "count(DISTINCT bidder) FILTER (WHERE price < 10) AS n"]`:
    any of the aggregates of aggfuncs/ (Spark SQL, several at once, over any columns);
    see sql_aggregate.py;
  - `value_column="amount", aggs=("count", "sum", "min", "max")`: count / sum / min /
    max of one numeric column, below.

Per epoch, Spark reduces the epoch's rows to one partial per key (`pre_aggregate`);
each subtask then merges its partials into state with one multi-get, a numpy merge
and one batch of puts, and emits the updated totals of the keys touched this epoch
(update mode). Null values are ignored by sum/min/max (SQL semantics); a key whose
values were all null has count > 0 and null sum/min/max.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api.sql_aggregate import SqlAggregate
from sparkpoint.errors import ConfigError
from sparkpoint.state.codec import FixedWidthCodec, parse_schema
from sparkpoint.state.interfaces import KEY_GROUP_COL, EpochContext, StatefulOperator
from sparkpoint.state.keys import encode_state_key_array, namespace

AGGREGATES = ("count", "sum", "min", "max")
# Partial columns produced by pre_aggregate; dunder names cannot clash with user keys.
P_COUNT, P_NVALUES, P_SUM, P_MIN, P_MAX = "__count", "__nvalues", "__sum", "__min", "__max"
_KEY_SCHEMA_META = "key_schema"
_TRACKED_META = "tracked_aggs"
_VALUE_TYPES = {"double": pa.float64(), "bigint": pa.int64(), "long": pa.int64()}


# -- helpers shared by the built-in keyed operators ------------------------------------
def parse_value_type(decl: str | pa.DataType) -> pa.DataType:
    if isinstance(decl, pa.DataType):
        if pa.types.is_floating(decl):
            return pa.float64()
        if pa.types.is_integer(decl):
            return pa.int64()
    t = _VALUE_TYPES.get(str(decl).lower())
    if t is None:
        raise ConfigError(f"value_type {decl!r} is not supported; use 'double' or 'bigint'")
    return t


def _nullable(df, column: str) -> bool:
    try:
        return df.schema[column].nullable
    except KeyError:  # not a plain column name: Spark resolves it, assume nulls
        return True


def identities(t: pa.DataType) -> tuple[Any, Any]:
    """(identity of min, identity of max) in value type `t`."""
    if pa.types.is_floating(t):
        return np.inf, -np.inf
    info = np.iinfo(np.int64)
    return int(info.max), int(info.min)


class KeySchema:
    """The key columns' Arrow types: declared up front, or taken from the input
    schema (`resolve`) by the runtime before `output_schema` is asked for."""

    def __init__(self, operator: str, key_columns: Sequence[str], declared: Any = None):
        if not key_columns:
            raise ConfigError(f"operator {operator!r} needs at least one key column")
        self.operator = operator
        self.key_columns = list(key_columns)
        self.schema: pa.Schema | None = None
        if declared is not None:
            self.resolve(parse_schema(declared, f"key_schema of operator {operator!r}"))

    def resolve(self, input_schema: pa.Schema) -> None:
        missing = [c for c in self.key_columns if c not in input_schema.names]
        if missing:
            raise ConfigError(f"operator {self.operator!r}: key column(s) {missing} are not in the "
                              f"input schema {input_schema.names}")
        self.schema = pa.schema([input_schema.field(c) for c in self.key_columns])

    def ensure(self, store, rows: pa.Table) -> None:
        """Know the key types in a worker even if the driver did not resolve them: from
        this epoch's rows, else from the types recorded in the store by an earlier epoch
        (Arrow IPC schema bytes, not pickle)."""
        if self.schema is None:
            if all(c in rows.column_names for c in self.key_columns):
                self.resolve(rows.schema)
            elif (raw := store.get_meta(_KEY_SCHEMA_META)) is not None:
                self.schema = pa.ipc.read_schema(pa.py_buffer(raw))
        if self.schema is not None and store.get_meta(_KEY_SCHEMA_META) is None:
            store.put_meta(_KEY_SCHEMA_META, self.schema.serialize().to_pybytes())

    def fields(self) -> list[pa.Field]:
        if self.schema is None:
            raise ConfigError(f"operator {self.operator!r} does not know its key column types yet: pass "
                              "key_schema=... (e.g. 'user STRING') or call resolve_input_schema(schema)")
        return list(self.schema)

    def cast_keys(self, keys: pa.Table) -> pa.Table:
        """Key columns in the declared types (when known), for stable output schemas."""
        if self.schema is None:
            return keys
        return keys.select(self.key_columns).cast(self.schema)


def require_key_groups(rows: pa.Table, operator: str) -> None:
    if rows.num_rows and KEY_GROUP_COL not in rows.column_names:
        raise ConfigError(f"operator {operator!r} got rows without the {KEY_GROUP_COL} column; the "
                          "runtime must add key groups before apply")


# -- the operator ----------------------------------------------------------------------
class KeyedAggregate(StatefulOperator):
    """Running aggregates per key, in update mode: each epoch, one row per key its rows
    touched, with the aggregates over all of the key's rows so far.

    `aggs=["count(*) AS n", "count(DISTINCT user) FILTER (WHERE price < 10) AS cheap_users"]`
    (no `value_column`): any Spark SQL aggregates, several at once over any columns
    (docs/aggregates.md). Or the one-column form, `value_column="amount", aggs=("count",
    "sum", "min", "max")`: count BIGINT; sum/min/max in `value_type`.

    Output columns: the key columns, then the aggregates in the order given."""

    def __init__(self, name: str, key_columns: Sequence[str], value_column: str | None = None,
                 aggs: Sequence[str] = AGGREGATES, *, value_type: str | pa.DataType = "double",
                 key_schema: Any = None):
        self.sql: SqlAggregate | None = None
        if value_column is None:
            self.name = name
            self.key_columns = list(key_columns)
            self.value_column = None
            self.keys = KeySchema(name, key_columns, key_schema)
            self.sql = SqlAggregate(f"KeyedAggregate {name!r}", self.keys, aggs)
            self.aggs = self.sql.aggs.names
            return
        unknown = [a for a in aggs if a not in AGGREGATES]
        if unknown or not aggs:
            raise ConfigError(f"KeyedAggregate {name!r}: aggs {list(aggs)} must be a non-empty subset "
                              f"of {list(AGGREGATES)}")
        clash = [c for c in key_columns if c in aggs]
        if clash:
            raise ConfigError(f"KeyedAggregate {name!r}: key column(s) {clash} clash with output "
                              "columns of the same name; rename them first")
        self.name = name
        self.key_columns = list(key_columns)
        self.value_column = value_column
        self.aggs = tuple(aggs)
        self.value_type = parse_value_type(value_type)
        self.keys = KeySchema(name, key_columns, key_schema)
        kind = "f8" if pa.types.is_floating(self.value_type) else "i8"
        self._codec = FixedWidthCodec(name, [("count", "i8"), ("nvalues", "i8"),
                                             ("sum", kind), ("min", kind), ("max", kind)])
        self._ns = namespace("agg")

    def resolve_input_schema(self, schema: pa.Schema) -> None:
        self.keys.resolve(schema)
        if self.sql is not None:
            self.sql.resolve_input_schema(schema)

    @property
    def output_schema(self) -> pa.Schema:
        if self.sql is not None:
            return self.sql.output_schema
        types = {"count": pa.int64(), "sum": self.value_type, "min": self.value_type, "max": self.value_type}
        return pa.schema([*self.keys.fields(), *[pa.field(a, types[a]) for a in self.aggs]])

    def pre_aggregate(self, df, carry=()):
        from pyspark.sql import functions as F

        if self.sql is not None:
            return self.sql.pre_aggregate(df, carry)
        v = F.col(self.value_column).cast("double" if pa.types.is_floating(self.value_type) else "bigint")
        # Only the partials the declared aggs need go through the shuffle (W1's count and
        # sum: 3 columns instead of 5, and 2 fewer aggregate functions per input row).
        partial = [F.count(F.lit(1)).alias(P_COUNT)]
        if set(self.aggs) - {"count"}:
            # A column without nulls counts as many values as rows: the same aggregate
            # as P_COUNT, which Spark computes once.
            partial.append((F.count(v) if _nullable(df, self.value_column) else F.count(F.lit(1))).alias(P_NVALUES))
        for agg, name in (("sum", P_SUM), ("min", P_MIN), ("max", P_MAX)):
            if agg in self.aggs:
                partial.append(getattr(F, agg)(v).alias(name))
        return df.groupBy(*self.key_columns).agg(*partial, *carry)

    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        if self.sql is not None:
            return self.sql.apply(store, rows)
        self.keys.ensure(store, rows)
        self._check_tracked(store)
        if rows.num_rows == 0:
            return self.output_schema.empty_table()
        require_key_groups(rows, self.name)
        partials, keys = self._in_key_order(self._partials(rows))
        if any(map(operator.eq, keys, itertools.islice(keys, 1, None))):
            # Spark's pre-aggregation leaves one row per key; raw or duplicated rows are
            # combined first, else two rows of one key would overwrite each other's merge.
            partials, keys = self._in_key_order(self._combine(partials))
        totals = self._merge(partials, store.get_many(keys))
        store.put_many(keys, self._codec.encode_many(totals))
        return self._output(partials, totals)

    # -- steps ---------------------------------------------------------------------------
    def _in_key_order(self, partials: pa.Table) -> tuple[pa.Table, list[bytes]]:
        """The partials sorted by their store keys, and the keys. Arrow sorts the encoded
        keys in the store's byte order (~35 ms per 160k keys), which the commit's Python
        sort then finds in one linear pass (instead of 40-60 ms); reads walk the store in
        order, and duplicate keys are neighbours (no set of all keys to find them)."""
        encoded = encode_state_key_array(partials, self.key_columns, KEY_GROUP_COL, self._ns)
        order = pc.sort_indices(encoded)
        return partials.take(order), encoded.take(order).to_numpy(zero_copy_only=False).tolist()

    def _check_tracked(self, store) -> None:
        """The stored sum/min/max are complete only for the aggs the state was built with
        (`pre_aggregate` leaves the others out): asking for another one later would
        silently aggregate only what came after, so it is refused."""
        raw = store.get_meta(_TRACKED_META)
        if raw is None:
            # State from before aggs were recorded tracked all of them.
            tracked = set(self.aggs) if store.epoch() < 0 else set(AGGREGATES)
            store.put_meta(_TRACKED_META, ",".join(sorted(tracked)).encode())
        else:
            tracked = set(raw.decode().split(","))
        added = [a for a in self.aggs if a not in tracked]
        if added:
            raise ConfigError(f"KeyedAggregate {self.name!r}: aggs {added} were added after its state began "
                              f"(the state tracks {sorted(tracked)}), so they would miss every earlier row. "
                              "Keep the aggs the state was built with, or give the operator a new name to "
                              "start its state from empty")

    def _partials(self, rows: pa.Table) -> pa.Table:
        """One row per key with partial columns, whether or not Spark pre-aggregated."""
        lo, hi = identities(self.value_type)
        if P_COUNT in rows.column_names:
            n = rows.num_rows
            count = rows.column(P_COUNT).cast(pa.int64())

            def partial(name: str, missing: Any) -> Any:  # a partial pre_aggregate left out
                if name in rows.column_names:
                    return rows.column(name).cast(count.type if name == P_NVALUES else self.value_type)
                return missing if isinstance(missing, (pa.Array, pa.ChunkedArray)) else \
                    pa.array(np.full(n, missing), self.value_type)

            cols = {P_COUNT: count, P_NVALUES: partial(P_NVALUES, count), P_SUM: partial(P_SUM, 0),
                    P_MIN: partial(P_MIN, lo), P_MAX: partial(P_MAX, hi)}
        else:  # raw rows: each is its own partial
            v = rows.column(self.value_column).cast(self.value_type)
            cols = {P_COUNT: pa.array(np.ones(rows.num_rows, dtype=np.int64)),
                    P_NVALUES: pc.cast(pc.is_valid(v), pa.int64()), P_SUM: v, P_MIN: v, P_MAX: v}
        cols[P_SUM] = pc.fill_null(cols[P_SUM], pa.scalar(0, self.value_type))
        cols[P_MIN] = pc.fill_null(cols[P_MIN], pa.scalar(lo, self.value_type))
        cols[P_MAX] = pc.fill_null(cols[P_MAX], pa.scalar(hi, self.value_type))
        table = rows.select([*self.key_columns, KEY_GROUP_COL])
        for name, col in cols.items():
            table = table.append_column(name, col)
        return table

    def _combine(self, table: pa.Table) -> pa.Table:
        grouped = table.group_by([*self.key_columns, KEY_GROUP_COL], use_threads=False).aggregate(
            [(P_COUNT, "sum"), (P_NVALUES, "sum"), (P_SUM, "sum"), (P_MIN, "min"), (P_MAX, "max")])
        return grouped.rename_columns({f"{P_COUNT}_sum": P_COUNT, f"{P_NVALUES}_sum": P_NVALUES,
                                       f"{P_SUM}_sum": P_SUM, f"{P_MIN}_min": P_MIN, f"{P_MAX}_max": P_MAX})

    def _merge(self, partials: pa.Table, stored: list[bytes | None]) -> np.ndarray:
        n = partials.num_rows
        totals = np.empty(n, dtype=self._codec.dtype)
        for field, col in (("count", P_COUNT), ("nvalues", P_NVALUES), ("sum", P_SUM),
                           ("min", P_MIN), ("max", P_MAX)):
            totals[field] = partials.column(col).to_numpy()
        found = np.fromiter((v is not None for v in stored), dtype=bool, count=n)
        if found.any():
            idx = np.flatnonzero(found)
            old = self._codec.decode_many([v for v in stored if v is not None])
            totals["count"][idx] += old["count"]
            totals["nvalues"][idx] += old["nvalues"]
            totals["sum"][idx] += old["sum"]
            totals["min"][idx] = np.minimum(totals["min"][idx], old["min"])
            totals["max"][idx] = np.maximum(totals["max"][idx], old["max"])
        return totals

    def _output(self, partials: pa.Table, totals: np.ndarray) -> pa.Table:
        no_values = totals["nvalues"] == 0
        out = self.keys.cast_keys(partials.select(self.key_columns))
        for a in self.aggs:
            if a == "count":
                out = out.append_column("count", pa.array(totals["count"], type=pa.int64()))
            else:
                out = out.append_column(a, pa.array(totals[a], type=self.value_type, mask=no_values))
        return out
