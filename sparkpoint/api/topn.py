"""`TopN`: the first `n` rows of each key in a given order, kept up to date as rows arrive
(Flink SQL's `ROW_NUMBER() OVER (PARTITION BY key ORDER BY ...) <= n`, Nexmark q18 and
q19).

The result is an updating one, as in Flink, but sinks here are append-only, so instead of
retracting a row that falls out of the top, a key whose top changed in an epoch is
emitted whole: its rows ranked 1, 2, ... (up to `n`) in the column `rank_column`. The
latest rows written for a key are its top now; a reader keeps, per (key, rank), the row
of the latest epoch (Parquet output carries `epoch`). A key the epoch's rows did not
change is not emitted.

Order: `order_by` names columns, each ascending, or `(column, "desc")` / `"column desc"`
for descending. Rows equal in every `order_by` column are ordered by the remaining
columns, ascending, so the result does not depend on how Spark split or ordered the
input; nulls sort last.

State: per key, its current top rows (at most `n`) as one Arrow IPC record-batch message
under `<key group><top><user key>`, their schema once in the store's metadata (never
pickled). The state moves with its key groups on rescale. No event time is needed: the
step does not drop late rows and its state does not expire.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api.aggregate import KeySchema, require_key_groups
from sparkpoint.errors import ConfigError
from sparkpoint.state.interfaces import KEY_GROUP_COL, EpochContext, StatefulOperator
from sparkpoint.state.keys import encode_user_keys, group_prefix, namespace
from sparkpoint.state.stored import StoredSchema

_ROWS_SCHEMA = StoredSchema("topn_rows_schema")
_KEY_INDEX, _IS_NEW = "__key_index", "__is_new"
_DIRECTIONS = {"asc": "ascending", "ascending": "ascending", "desc": "descending", "descending": "descending"}


def _parse_order(order_by: Any, what: str) -> list[tuple[str, str]]:
    items = [order_by] if isinstance(order_by, (str, tuple)) else list(order_by or [])
    out: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, str):
            parts = item.split()
            column, direction = (parts[0], parts[1] if len(parts) == 2 else "asc") if parts else ("", "")
            if len(parts) > 2:
                direction = ""
        elif isinstance(item, tuple) and len(item) == 2:
            column, direction = item
        else:
            column, direction = "", ""
        if not column or str(direction).lower() not in _DIRECTIONS:
            raise ConfigError(f"{what}: order_by entries are 'column', 'column desc' or ('column', 'desc'), "
                              f"got {item!r}")
        out.append((column, _DIRECTIONS[str(direction).lower()]))
    if not out:
        raise ConfigError(f"{what}: order_by names at least one column")
    return out


class TopN(StatefulOperator):
    """The first `n` rows of each key (`key_columns`) by `order_by`, emitted whole, with
    their rank, whenever an epoch changes them."""

    kind = "topn"

    def __init__(self, name: str, key_columns: str | Sequence[str], order_by: Any, n: int, *,
                 rank_column: str = "rank", key_schema: Any = None):
        what = f"TopN {name!r}"
        self.name = name
        self.key_columns = [key_columns] if isinstance(key_columns, str) else list(key_columns)
        self.order_by = _parse_order(order_by, what)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"{what}: n must be a whole number >= 1, got {n!r}")
        self.n = n
        self.rank_column = rank_column
        clash = [c for c in (*self.key_columns, *(c for c, _ in self.order_by)) if c == rank_column]
        if clash:
            raise ConfigError(f"{what}: the input has a column named {rank_column!r} already; pass rank_column=...")
        self.keys = KeySchema(name, self.key_columns, key_schema)
        self._rows_schema: pa.Schema | None = None
        self._stored_schema: pa.Schema | None = None  # what this store's rows were written in
        self._ns = namespace("topn")

    # -- driver side -----------------------------------------------------------------------
    def resolve_input_schema(self, schema: pa.Schema) -> None:
        self.keys.resolve(schema)
        rows = pa.schema([f for f in schema if not f.name.startswith("__")])
        missing = [c for c, _ in self.order_by if c not in rows.names]
        if missing:
            raise ConfigError(f"TopN {self.name!r}: order_by column(s) {missing} are not in the input {rows.names}")
        if self.rank_column in rows.names:
            raise ConfigError(f"TopN {self.name!r}: the input has a column named {self.rank_column!r} already; "
                              "pass rank_column=...")
        self._rows_schema = rows

    @property
    def output_schema(self) -> pa.Schema:
        if self._rows_schema is None:
            raise ConfigError(f"TopN {self.name!r} does not know its input columns yet: the runtime calls "
                              "resolve_input_schema(schema) before the first epoch")
        return self._rows_schema.append(pa.field(self.rank_column, pa.int64()))

    # -- worker side -----------------------------------------------------------------------
    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        self.keys.ensure(store, rows)
        self._ensure_schema(store, rows)
        if not rows.num_rows:
            return self.output_schema.empty_table() if self._rows_schema is not None else pa.table({})
        require_key_groups(rows, self.name)
        schema = self._rows_schema
        user_keys = encode_user_keys(rows, self.key_columns)
        groups = rows.column(KEY_GROUP_COL).to_numpy(zero_copy_only=False)
        index: dict[bytes, int] = {}
        key_of_row = np.fromiter((index.setdefault(group_prefix(int(g), self._ns) + k, len(index))
                                  for g, k in zip(groups, user_keys)), dtype=np.int64, count=rows.num_rows)
        state_keys = list(index)
        stored = store.get_many(state_keys)
        old = [self._decode(v) for v in stored]
        old_key = np.repeat(np.arange(len(state_keys), dtype=np.int64), [t.num_rows for t in old])
        combined = pa.concat_tables([*[t for t in old if t.num_rows],
                                     rows.select(schema.names).cast(schema)])
        combined = combined.append_column(_KEY_INDEX, pa.array(np.concatenate([old_key, key_of_row]))) \
            .append_column(_IS_NEW, pa.array(np.arange(combined.num_rows) >= len(old_key)))
        ranked = combined.take(pc.sort_indices(combined, sort_keys=self._sort_keys(schema), null_placement="at_end"))
        keys = ranked.column(_KEY_INDEX).to_numpy()
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.array([], np.int64)
        rank = np.arange(len(keys)) - np.repeat(starts, np.diff(np.r_[starts, len(keys)]))
        top = ranked.filter(pa.array(rank < self.n))
        rank = rank[rank < self.n]
        top_keys = top.column(_KEY_INDEX).to_numpy()
        changed = np.unique(top_keys[top.column(_IS_NEW).to_numpy(zero_copy_only=False)])
        emitted = top.filter(pa.array(np.isin(top_keys, changed)))
        emitted_rank = rank[np.isin(top_keys, changed)]
        self._store_tops(store, state_keys, emitted.select(schema.names), emitted.column(_KEY_INDEX).to_numpy())
        return emitted.select(schema.names).append_column(self.rank_column, pa.array(emitted_rank + 1, pa.int64()))

    def _sort_keys(self, schema: pa.Schema) -> list[tuple[str, str]]:
        named = {c for c, _ in self.order_by}
        ties = [(c, "ascending") for c in schema.names if c not in named and _sortable(schema.field(c).type)]
        return [(_KEY_INDEX, "ascending"), *self.order_by, *ties]

    def _store_tops(self, store, state_keys: list[bytes], tops: pa.Table, key_index: np.ndarray) -> None:
        if not tops.num_rows:
            return
        bounds = np.flatnonzero(np.r_[True, key_index[1:] != key_index[:-1], True])
        batch = tops.combine_chunks().to_batches()[0]
        keys, values = [], []
        for a, b in zip(bounds[:-1], bounds[1:]):
            keys.append(state_keys[int(key_index[a])])
            values.append(batch.slice(int(a), int(b - a)).serialize().to_pybytes())
        store.put_many(keys, values)

    def _decode(self, value: bytes | None) -> pa.Table:
        schema = self._rows_schema
        if value is None:
            return schema.empty_table()
        stored = self._stored_schema or schema
        batch = pa.ipc.read_record_batch(pa.py_buffer(value), stored)
        table = pa.Table.from_batches([batch], stored)
        if table.schema == schema:
            return table
        try:
            return table.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
            raise ConfigError(f"TopN {self.name!r}: its input changed columns since its state began ({stored} "
                              f"cannot be read as {schema}: {e}); keep the input's columns, or give the step a new "
                              "name to start its state from empty") from None

    def _ensure_schema(self, store, rows: pa.Table) -> None:
        """The rows' schema: from the driver, else this epoch's rows, else an earlier epoch's
        record in the store; stored rows are read in the schema the state began with."""
        recorded = _ROWS_SCHEMA.read(store)
        if self._rows_schema is None:
            if rows.num_rows:
                self._rows_schema = pa.schema([f for f in rows.schema if not f.name.startswith("__")])
            else:
                self._rows_schema = recorded
        if self._rows_schema is not None:
            _ROWS_SCHEMA.keep(store, self._rows_schema)
        self._stored_schema = recorded or self._rows_schema


def _sortable(t: pa.DataType) -> bool:
    return not (pa.types.is_nested(t) or pa.types.is_dictionary(t))
