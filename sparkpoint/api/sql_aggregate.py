"""`KeyedAggregate(name, keys, aggs=[...Spark SQL...])`: several aggregates per key.

Per epoch Spark reduces the epoch's rows to one row of partials per key (aggfuncs/
engine.py says which partials are splittable and which buffer values); each subtask
reads the stored partials of the keys it got, merges the epoch's after them, writes
them back and emits the keys' results so far (update mode, as `KeyedAggregate`).

State: per key one msgpack list of partials under `<group><agg-sql><key>`, decoded with
the partial schema recorded in the store (aggfuncs/stored.py); nothing is pickled.
"""

from __future__ import annotations

import itertools
import operator
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api.aggfuncs import AggregateSet, rows as stored_rows
from sparkpoint.api.aggfuncs.stored import check_recorded, epoch_partials, merge_stored
from sparkpoint.errors import ConfigError
from sparkpoint.state.interfaces import KEY_GROUP_COL
from sparkpoint.state.keys import encode_state_key_array, namespace


class SqlAggregate:
    def __init__(self, what: str, keys, aggs: Sequence[str]):
        self.what = what
        self.keys = keys
        self.aggs = AggregateSet(what, aggs)
        clash = [c for c in keys.key_columns if c in self.aggs.names]
        if clash:
            raise ConfigError(f"{what}: key column(s) {clash} clash with aggregates of the same name; name the "
                              "aggregates otherwise with AS")
        self._ns = namespace("agg-sql")

    def resolve_input_schema(self, schema: pa.Schema) -> None:
        if not self.aggs.resolved:
            self.aggs.resolve_from_input(schema)

    @property
    def output_schema(self) -> pa.Schema:
        return pa.schema([*self.keys.fields(), *self.aggs.output_fields()])

    def pre_aggregate(self, df, carry=()):
        pre = df.groupBy(*self.keys.key_columns).agg(*self.aggs.spark_partials(), *carry)
        # The partial types as Spark computes them (any expression): the driver knows
        # the output schema before the operator is shipped to the workers.
        self.aggs.resolve_from_spark(pre.schema)
        return pre

    def apply(self, store, rows: pa.Table) -> pa.Table:
        self.keys.ensure(store, rows)
        if rows.num_rows == 0:
            check_recorded(store, self.aggs, self.what)
            return self.output_schema.empty_table() if self.aggs.resolved else pa.table({})
        keep = [*self.keys.key_columns, KEY_GROUP_COL]
        partials = epoch_partials(self.aggs, rows, keep)
        check_recorded(store, self.aggs, self.what)
        partials, keys = self._in_key_order(partials)
        if any(map(operator.eq, keys, itertools.islice(keys, 1, None))):
            # Spark's pre-aggregation leaves one row per key; raw rows (the test harness)
            # are combined first, else two rows of a key would overwrite each other.
            partials, keys = self._in_key_order(self.aggs.combine(partials, keep))
        merged = merge_stored(self.aggs, partials, store.get_many(keys), self.what)
        store.put_many(keys, stored_rows.encode_many(merged, self.aggs.part_schema()))
        out = self.keys.cast_keys(partials.select(self.keys.key_columns))
        for field, col in zip(self.aggs.output_fields(), self.aggs.results(merged)):
            out = out.append_column(field, col.cast(field.type))
        return out

    def _in_key_order(self, partials: pa.Table) -> tuple[pa.Table, list[bytes]]:
        """The partials sorted by their store keys (reads and writes walk the store in
        order; rows of one key are neighbours), and the keys."""
        encoded = encode_state_key_array(partials, self.keys.key_columns, KEY_GROUP_COL, self._ns)
        order = pc.sort_indices(encoded)
        return partials.take(order), encoded.take(order).to_numpy(zero_copy_only=False).tolist()
