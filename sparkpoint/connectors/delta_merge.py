"""Merge by key for the Delta sink: the keys a user names, the last row per key, and the
MERGE predicate. Pure Arrow, no delta-rs: the executors' writer uses it too.

"Last" is the order rows were written in: by epoch, then by task (Spark partition) within
an epoch, then by row within a task. A keyed step emits each key of an epoch from the one
subtask that owns it, so two rows of one key in one epoch come from one task, in the
order the step emitted them."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from sparkpoint.errors import ConfigError

_ROW = "__sparkpoint_row"


def check_merge_keys(sink: str, keys: Any) -> tuple[str, ...] | None:
    """The merge key columns as given to the sink, checked; None means append."""
    if keys is None:
        return None
    where = f"sink {sink}: merge_keys"
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise ConfigError(f"{where} must be a list of column names, e.g. ['key', 'window_start'], got {keys!r}")
    if not keys:
        raise ConfigError(f"{where} needs at least one column (the output's key columns, e.g. ['key', "
                          f"'window_start']); leave merge_keys out to append every row")
    if not all(isinstance(k, str) and k for k in keys):
        raise ConfigError(f"{where} must be non-empty strings (column names), got {list(keys)!r}")
    if any("`" in k for k in keys):
        raise ConfigError(f"{where}: a key column's name cannot contain a backtick: {list(keys)!r}")
    twice = sorted({k for k in keys if list(keys).count(k) > 1})
    if twice:
        raise ConfigError(f"{where} names {twice} more than once: {list(keys)!r}")
    return tuple(keys)


def missing_keys(sink: str, keys: Sequence[str], columns: Sequence[str]) -> ConfigError | None:
    missing = [k for k in keys if k not in columns]
    if not missing:
        return None
    return ConfigError(f"sink {sink}: merge_keys {missing} are not columns of the output ({', '.join(columns)}); "
                       f"name the output's key columns in DeltaSink(merge_keys=...)")


def last_per_key(sink: str, rows: pa.Table, keys: Sequence[str]) -> pa.Table:
    """One row per key, the last in `rows`' order, kept in that order. Null key values
    are one key (as the merge predicate's IS NOT DISTINCT FROM matches them)."""
    error = missing_keys(sink, keys, rows.column_names)
    if error is not None:
        raise error
    if rows.num_rows <= 1:
        return rows
    numbered = rows.select(list(keys)).append_column(_ROW, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    try:
        last = numbered.group_by(list(keys), use_threads=False).aggregate([(_ROW, "max")]).column(f"{_ROW}_max")
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        types = ", ".join(f"{k} {rows.schema.field(k).type}" for k in keys)
        raise ConfigError(f"sink {sink}: merge_keys ({types}) cannot be compared as keys ({e}); use columns of "
                          f"plain types (strings, numbers, dates, timestamps)") from e
    if len(last) == rows.num_rows:
        return rows
    return rows.take(pa.array(np.sort(last.to_numpy())))


def merge_predicate(keys: Sequence[str]) -> str:
    """A target row is a source row's when every key is equal, nulls equal to nulls."""
    return " AND ".join(f"(target.`{k}` IS NOT DISTINCT FROM source.`{k}`)" for k in keys)
