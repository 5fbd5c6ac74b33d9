"""Partials kept in a step's store: the partial schema recorded once in the store's
metadata (Arrow IPC schema bytes), checked against the step's aggregates on every
epoch, and the merge of stored partials with an epoch's."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api.aggfuncs import rows
from sparkpoint.api.aggfuncs.engine import AggregateSet
from sparkpoint.errors import ConfigError

PARTS_META = "agg_parts_schema"
SLOT = "__slot"


def check_recorded(store, aggs: AggregateSet, operator: str) -> None:
    """Record the partial schema, or refuse aggregates other than those the state was
    built with: a new one would silently miss every earlier row."""
    raw = store.get_meta(PARTS_META)
    if raw is None:
        if aggs.resolved:
            store.put_meta(PARTS_META, aggs.part_schema().serialize().to_pybytes())
        return
    recorded = pa.ipc.read_schema(pa.py_buffer(raw))
    if not aggs.resolved:
        aggs.resolve_from_partials(recorded)
        return
    if not recorded.equals(aggs.part_schema()):
        raise ConfigError(f"{operator}: its aggregates {list(aggs.names)} keep other partials than those its state "
                          f"was built with ({', '.join(f'{f.name} {f.type}' for f in recorded)}), so they would miss "
                          "every earlier row. Keep the aggregates the state was built with, or give the step a new "
                          "name to start its state from empty")


def epoch_partials(aggs: AggregateSet, rows_in: pa.Table, keep: list[str]) -> pa.Table:
    """`keep` columns of `rows_in` with the partial columns: Spark's as they came, or one
    partial per raw row."""
    table = rows_in.select(keep)
    if all(n in rows_in.column_names for n in aggs.part_names):
        if not aggs.resolved:
            aggs.resolve_from_partials(rows_in.schema)
        schema = aggs.part_schema()
        for f in schema:
            table = table.append_column(f.name, rows_in.column(f.name).cast(f.type))
        return table
    for name, col in aggs.row_partials(rows_in).items():
        table = table.append_column(name, col)
    return table


def merge_stored(aggs: AggregateSet, new: pa.Table, stored: list[bytes | None], operator: str) -> pa.Table:
    """`new`'s partial columns (one row per slot) merged after the `stored` partials of
    the same slots (None: nothing stored): one row per slot, in slot order."""
    schema = aggs.part_schema()
    parts = new.select(schema.names).cast(schema)
    found = np.flatnonzero(np.fromiter((v is not None for v in stored), dtype=bool, count=len(stored)))
    if not len(found):
        return parts
    old = rows.decode_many([stored[i] for i in found], schema, operator)
    both = pa.concat_tables([old.append_column(SLOT, pa.array(found, pa.int64())),
                             parts.append_column(SLOT, pa.array(np.arange(parts.num_rows), pa.int64()))])
    merged = aggs.combine(both, [SLOT])
    return merged.take(pc.sort_indices(merged.column(SLOT))).select(schema.names)
