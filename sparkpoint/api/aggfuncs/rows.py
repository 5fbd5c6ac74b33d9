"""Stored partials: one msgpack list per group (a key, or a window), decoded with the
partial schema the step declares and records in its store, never by pickle.

Values are stored as plain msgpack values: timestamps and dates as their integer
count, decimals as text, lists as lists; `decode_many` rebuilds each column in its
declared Arrow type."""

from __future__ import annotations

import msgpack
import pyarrow as pa

from sparkpoint.errors import StateSchemaError

_VERSION = b"\x01"


def storage_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(storage_type(t.value_type))
    if pa.types.is_timestamp(t) or pa.types.is_date64(t) or pa.types.is_duration(t) or pa.types.is_time64(t):
        return pa.int64()
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    if pa.types.is_decimal(t):
        return pa.string()
    return t


def encode_many(parts: pa.Table, schema: pa.Schema) -> list[bytes]:
    cols = [parts.column(f.name).cast(f.type).cast(storage_type(f.type)).to_pylist() for f in schema]
    return [_VERSION + msgpack.packb(list(row), use_bin_type=True) for row in zip(*cols)]


def decode_many(raw: list[bytes], schema: pa.Schema, what: str) -> pa.Table:
    rows = []
    for value in raw:
        if value[:1] != _VERSION:
            raise StateSchemaError(f"{what}: stored aggregate partials have format version {value[:1]!r}, this "
                                   f"version reads {_VERSION!r}")
        rows.append(msgpack.unpackb(value[1:], raw=False))
    arrays = []
    for i, f in enumerate(schema):
        arrays.append(pa.array([r[i] for r in rows], storage_type(f.type)).cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)
