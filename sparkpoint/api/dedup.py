"""`Deduplicate`: drop rows whose key was already seen, within a bound of event time.

Spark's `dropDuplicatesWithinWatermark` and Flink SQL's deduplication (ROW_NUMBER() = 1
ordered by event time, with state TTL) keep the first row of each key and drop the
others. Keeping every key forever would grow state without end, so a key is held for
`within` of event time after its first row:

    a row of key k at event time t is emitted        if k is not held;
    then k is held until the watermark reaches       t + within;
    a row whose event time is below the watermark    is late: dropped and counted.

So a duplicate is always dropped when it comes within `within` of the first row's event
time (and before the watermark has passed that point); later than that it is a new first
row. Spark derives the bound from the watermark delay; here it is named on the step, as
Flink's TTL is, so one stream can feed several dedups of different horizons.

Within one epoch the rows of a key are ordered by event time (then input order) and the
earliest one is the first, so the outcome depends on the rows, not on how Spark split
them into tasks. At the end of a bounded input nothing more is dropped as late.

Output: the input rows that were kept, all their columns, unchanged.

State, per key group (state/keys.py): `<group><seen><user key>` holds the time the key is
released, and `<group><release><time><user key>` orders the same keys by that time, so
the watermark releases them with one range scan per key group. Nothing is kept in Python
between epochs; the state moves with its key groups on rescale.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api import event_time
from sparkpoint.api.aggregate import KeySchema, require_key_groups
from sparkpoint.api.durations import duration_ms
from sparkpoint.errors import ConfigError
from sparkpoint.state.interfaces import KEY_GROUP_COL, EpochContext, StatefulOperator
from sparkpoint.state.keys import encode_timestamp, encode_user_keys, group_prefix, key_group_range, namespace
from sparkpoint.state.stored import StoredCounter, StoredSchema

_DROPPED = StoredCounter("dedup_dropped")
_INPUT_SCHEMA = StoredSchema("dedup_input_schema")
_TS_LEN = 8


class Deduplicate(StatefulOperator):
    """Keep the first row of each key (`key_columns`) by event time (`time_column`);
    drop the key's later rows that come within `within` of event time of it."""

    kind = "dedup"
    requires_event_time = True

    def __init__(self, name: str, key_columns: str | Sequence[str], time_column: str, within: int | str, *,
                 key_schema: Any = None):
        what = f"Deduplicate {name!r}"
        self.name = name
        self.key_columns = [key_columns] if isinstance(key_columns, str) else list(key_columns)
        if time_column in self.key_columns:
            raise ConfigError(f"{what}: the event-time column {time_column!r} cannot also be a key column "
                              "(every row would be its own key)")
        self.time_column = time_column
        self.within_ms = duration_ms(within, f"{what} within")
        if self.within_ms <= 0:
            raise ConfigError(f"{what}: within must be > 0, got {self.within_ms} ms")
        self.keys = KeySchema(name, self.key_columns, key_schema)
        self._input_schema: pa.Schema | None = None
        self._ns_seen = namespace("dedup")
        self._ns_release = namespace("dedup-release")

    # -- driver side -----------------------------------------------------------------------
    def resolve_input_schema(self, schema: pa.Schema) -> None:
        self.keys.resolve(schema)
        event_time.arrow_kind(schema, self.time_column, f"Deduplicate {self.name!r}")
        self._input_schema = _user_columns(schema)

    @property
    def output_schema(self) -> pa.Schema:
        if self._input_schema is None:
            raise ConfigError(f"Deduplicate {self.name!r} does not know its input columns yet: the runtime "
                              "calls resolve_input_schema(schema) before the first epoch")
        return self._input_schema

    # -- worker side -----------------------------------------------------------------------
    @staticmethod
    def dropped_count(store) -> int:
        """Rows dropped so far as late (committed + this epoch)."""
        return _DROPPED.value(store)

    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        self.keys.ensure(store, rows)
        self._ensure_schema(store, rows)
        watermark = None if ctx.final else ctx.watermark_ms
        if watermark is not None:
            self._release(store, key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism), watermark)
        if not rows.num_rows:
            return self.output_schema.empty_table()
        require_key_groups(rows, self.name)
        ms = pc.fill_null(event_time.arrow_ms(rows.column(self.time_column)), np.iinfo(np.int64).min)
        times = np.asarray(ms.to_numpy(zero_copy_only=False), dtype=np.int64)
        on_time = times >= watermark if watermark is not None else times > np.iinfo(np.int64).min
        dropped = int(rows.num_rows - on_time.sum())
        _DROPPED.add(store, dropped)  # late rows, and rows without an event time, which no watermark releases
        candidates = np.flatnonzero(on_time)
        # The earliest row of each key this epoch (a stable sort keeps input order on ties).
        candidates = candidates[np.argsort(times[candidates], kind="stable")]
        user_keys = encode_user_keys(rows.take(pa.array(candidates, pa.int64())), self.key_columns)
        groups = rows.column(KEY_GROUP_COL).to_numpy(zero_copy_only=False)[candidates]
        first: dict[bytes, int] = {}
        for i, (g, k) in enumerate(zip(groups, user_keys)):
            first.setdefault(group_prefix(int(g), self._ns_seen) + k, i)
        seen_keys = list(first)
        held = store.get_many(seen_keys)
        new_keys = [k for k, h in zip(seen_keys, held) if h is None]
        keep = [first[k] for k in new_keys]
        if keep:
            kept_rows = [int(candidates[i]) for i in keep]
            releases = [int(times[r]) + self.within_ms for r in kept_rows]
            store.put_many(new_keys, [encode_timestamp(t) for t in releases])
            store.put_many([group_prefix(int(groups[i]), self._ns_release) + encode_timestamp(t) + user_keys[i]
                            for i, t in zip(keep, releases)], [b""] * len(keep))
            kept_rows.sort()  # output in input order
            return rows.take(pa.array(kept_rows, pa.int64())).select(self.output_schema.names) \
                .cast(self.output_schema)
        return self.output_schema.empty_table()

    def _release(self, store, groups: range, watermark: int) -> None:
        """Forget every key whose release time the watermark has reached."""
        doomed: list[bytes] = []
        for g in groups:
            prefix = group_prefix(g, self._ns_release)
            seen = group_prefix(g, self._ns_seen)
            for key, _ in store.scan_range(prefix, prefix + encode_timestamp(watermark + 1)):
                doomed.append(key)
                doomed.append(seen + key[len(prefix) + _TS_LEN:])
        if doomed:
            store.delete_many(doomed)

    def _ensure_schema(self, store, rows: pa.Table) -> None:
        """Know the output columns in a worker even if the driver did not resolve them: from
        this epoch's rows, else from the schema an earlier epoch recorded (Arrow IPC bytes)."""
        if self._input_schema is None:
            if rows.num_rows and self.time_column in rows.column_names:
                self._input_schema = _user_columns(rows.schema)
            else:
                self._input_schema = _INPUT_SCHEMA.read(store)
        if self._input_schema is not None:
            _INPUT_SCHEMA.keep(store, self._input_schema)


def _user_columns(schema: pa.Schema) -> pa.Schema:
    """The input's own columns: the runtime's (`__kg`, `__subtask`, ...) left out."""
    return pa.schema([f for f in schema if not f.name.startswith("__")])
