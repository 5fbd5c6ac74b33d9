"""State value encoding from declared schemas. Never pickle: values are msgpack (one
version byte, then the row as a list in schema order) or, for the built-in numeric
aggregates, fixed-width numpy records.

A schema may be declared as a `pyarrow.Schema`, a Spark DDL string
("count BIGINT, total DOUBLE") or a `pyspark.sql.types.StructType` (duck-typed, so
this module never imports pyspark).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import msgpack
import numpy as np
import pyarrow as pa

from sparkpoint.errors import StateSchemaError

CODEC_VERSION = 1
_VERSION_BYTE = bytes([CODEC_VERSION])
_UTC = dt.timezone.utc
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)

_DDL_TYPES: dict[str, pa.DataType] = {
    "BIGINT": pa.int64(), "LONG": pa.int64(),
    "INT": pa.int32(), "INTEGER": pa.int32(),
    "SMALLINT": pa.int16(), "SHORT": pa.int16(),
    "TINYINT": pa.int8(), "BYTE": pa.int8(),
    "DOUBLE": pa.float64(), "FLOAT": pa.float32(), "REAL": pa.float32(),
    "STRING": pa.string(), "VARCHAR": pa.string(),
    "BOOLEAN": pa.bool_(), "BOOL": pa.bool_(),
    "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    "BINARY": pa.binary(),
}
# Spark DataType.typeName() -> DDL keyword
_SPARK_TYPE_NAMES = {"long": "BIGINT", "integer": "INT", "short": "SMALLINT", "byte": "TINYINT",
                     "double": "DOUBLE", "float": "FLOAT", "string": "STRING", "boolean": "BOOLEAN",
                     "timestamp": "TIMESTAMP", "binary": "BINARY"}
_FIELD_RE = re.compile(r"^\s*`?([A-Za-z_][A-Za-z0-9_]*)`?\s*:?\s+([A-Za-z]+)\s*(NOT\s+NULL)?\s*$", re.IGNORECASE)

SchemaLike = Any  # pa.Schema | str | pyspark StructType


def parse_schema(decl: SchemaLike, what: str = "schema") -> pa.Schema:
    """Turn a declared schema into a pyarrow schema. Raises StateSchemaError naming
    `what` and the offending field."""
    if isinstance(decl, pa.Schema):
        return decl
    if isinstance(decl, str):
        return _parse_ddl(decl, what)
    if hasattr(decl, "fields"):  # pyspark StructType
        fields = []
        for f in decl.fields:
            name = f.dataType.typeName()
            if name not in _SPARK_TYPE_NAMES:
                raise StateSchemaError(f"{what}: field {f.name!r} has Spark type {name}, which state "
                                       f"cannot hold; use one of {sorted(_SPARK_TYPE_NAMES)}")
            fields.append(pa.field(f.name, _DDL_TYPES[_SPARK_TYPE_NAMES[name]], nullable=bool(f.nullable)))
        return pa.schema(fields)
    raise StateSchemaError(f"{what}: expected a pyarrow.Schema, a DDL string or a StructType, "
                           f"got {type(decl).__name__}")


def _parse_ddl(ddl: str, what: str) -> pa.Schema:
    if "<" in ddl or "(" in ddl:
        raise StateSchemaError(f"{what}: nested and parameterized types are not supported in {ddl!r}; "
                               f"use flat fields of {sorted(_DDL_TYPES)}")
    fields = []
    for part in ddl.split(","):
        m = _FIELD_RE.match(part)
        if not m:
            raise StateSchemaError(f"{what}: cannot parse field {part.strip()!r} in {ddl!r}; "
                                   "write it as 'name TYPE' (e.g. 'count BIGINT, total DOUBLE')")
        name, typ, not_null = m.group(1), m.group(2).upper(), m.group(3)
        if typ not in _DDL_TYPES:
            raise StateSchemaError(f"{what}: field {name!r} has type {typ}, which state cannot hold; "
                                   f"use one of {sorted(_DDL_TYPES)}")
        fields.append(pa.field(name, _DDL_TYPES[typ], nullable=not not_null))
    if len({f.name for f in fields}) != len(fields):
        raise StateSchemaError(f"{what}: duplicate field names in {ddl!r}")
    return pa.schema(fields)


# -- per-type validation: python value -> msgpack-able value, and back -------------------
_INT_BOUNDS = {8: (-(1 << 7), (1 << 7) - 1), 16: (-(1 << 15), (1 << 15) - 1),
               32: (-(1 << 31), (1 << 31) - 1), 64: (-(1 << 63), (1 << 63) - 1)}


def _to_int(v: Any, t: pa.DataType) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"expected an integer, got {type(v).__name__}")
    lo, hi = _INT_BOUNDS[t.bit_width]
    if not lo <= int(v) <= hi:
        raise TypeError(f"{v} does not fit in {t}")
    return int(v)


def _to_float(v: Any, t: pa.DataType) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"expected a number, got {type(v).__name__}")
    return float(v)


def _to_str(v: Any, t: pa.DataType) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return v


def _to_bool(v: Any, t: pa.DataType) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"expected a boolean, got {type(v).__name__}")
    return bool(v)


def _to_bytes(v: Any, t: pa.DataType) -> bytes:
    if not isinstance(v, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes, got {type(v).__name__}")
    return bytes(v)


def _to_micros(v: Any, t: pa.DataType) -> int:
    if isinstance(v, np.datetime64):
        return int(v.astype("datetime64[us]").astype(np.int64))
    if isinstance(v, dt.datetime):  # includes pandas.Timestamp; naive means UTC
        aware = v if v.tzinfo is not None else v.replace(tzinfo=_UTC)
        return (aware - _EPOCH) // dt.timedelta(microseconds=1)
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return int(v)
    raise TypeError(f"expected a datetime or microseconds since epoch, got {type(v).__name__}")


def _from_micros(v: Any, t: pa.DataType) -> dt.datetime:
    if not isinstance(v, int):
        raise TypeError(f"expected microseconds, found {type(v).__name__}")
    return _EPOCH + dt.timedelta(microseconds=v)


def _check(expected: type | tuple[type, ...]) -> Callable[[Any, pa.DataType], Any]:
    def check(v: Any, t: pa.DataType) -> Any:
        if not isinstance(v, expected) or (expected is int and isinstance(v, bool)):
            raise TypeError(f"found {type(v).__name__}")
        return v
    return check


@dataclass(frozen=True)
class _FieldCodec:
    name: str
    type: pa.DataType
    nullable: bool
    encode: Callable[[Any, pa.DataType], Any]
    decode: Callable[[Any, pa.DataType], Any]


def _field_codec(f: pa.Field) -> _FieldCodec:
    t = f.type
    if pa.types.is_integer(t):
        enc, dec = _to_int, _check(int)
    elif pa.types.is_floating(t):
        enc, dec = _to_float, _check(float)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        enc, dec = _to_str, _check(str)
    elif pa.types.is_boolean(t):
        enc, dec = _to_bool, _check(bool)
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        enc, dec = _to_bytes, _check(bytes)
    elif pa.types.is_timestamp(t):
        enc, dec = _to_micros, _from_micros
    else:
        raise StateSchemaError(f"field {f.name!r} has type {t}, which state cannot hold")
    return _FieldCodec(f.name, t, f.nullable, enc, dec)


def _is_missing(v: Any, t: pa.DataType) -> bool:
    """None, pandas NA/NaT, or NaN standing in for a missing non-float value (pandas)."""
    if v is None or type(v).__name__ in ("NAType", "NaTType"):
        return True
    return isinstance(v, float) and v != v and not pa.types.is_floating(t)


class RowCodec:
    """Encodes one row (tuple, list, dict or pandas Series) of a declared schema.

    Raises StateSchemaError naming the state and the field on a wrong arity, type or
    null, both when encoding and when decoding (a value written under another schema)."""

    def __init__(self, state_name: str, schema: SchemaLike):
        self.state_name = state_name
        self.schema = parse_schema(schema, f"state {state_name!r}")
        self._fields = [_field_codec(f) for f in self.schema]

    def encode(self, row: Any) -> bytes:
        return _VERSION_BYTE + msgpack.packb(self.to_plain(row), use_bin_type=True)

    def to_plain(self, row: Any) -> list[Any]:
        values = self._as_sequence(row)
        out = []
        for f, v in zip(self._fields, values):
            if _is_missing(v, f.type):
                if not f.nullable:
                    raise StateSchemaError(f"state {self.state_name!r}: field {f.name!r} is NOT NULL "
                                           "but the value is missing")
                out.append(None)
                continue
            try:
                out.append(f.encode(v, f.type))
            except TypeError as e:
                raise StateSchemaError(f"state {self.state_name!r}: field {f.name!r} ({f.type}): {e}") from None
        return out

    def decode(self, data: bytes) -> tuple:
        if not data or data[0] != CODEC_VERSION:
            raise StateSchemaError(f"state {self.state_name!r}: stored value has codec version "
                                   f"{data[0] if data else None}, expected {CODEC_VERSION}")
        try:
            values = msgpack.unpackb(data[1:], raw=False)
        except Exception as e:
            raise StateSchemaError(f"state {self.state_name!r}: stored value is not valid msgpack: {e}") from None
        return self.from_plain(values)

    def from_plain(self, values: Any) -> tuple:
        if not isinstance(values, list) or len(values) != len(self._fields):
            n = len(values) if isinstance(values, list) else "not a row"
            raise StateSchemaError(f"state {self.state_name!r}: stored value has {n} fields, the declared "
                                   f"schema has {len(self._fields)} ({self.schema.names}); the state was "
                                   "written under another schema")
        out = []
        for f, v in zip(self._fields, values):
            if v is None:
                if not f.nullable:
                    raise StateSchemaError(f"state {self.state_name!r}: field {f.name!r} is NOT NULL "
                                           "but the stored value is null")
                out.append(None)
                continue
            try:
                out.append(f.decode(v, f.type))
            except TypeError as e:
                raise StateSchemaError(f"state {self.state_name!r}: stored field {f.name!r} does not "
                                       f"match {f.type}: {e}") from None
        return tuple(out)

    def _as_sequence(self, row: Any) -> Sequence[Any]:
        if isinstance(row, Mapping):
            missing = [f.name for f in self._fields if f.name not in row]
            if missing:
                raise StateSchemaError(f"state {self.state_name!r}: value lacks field(s) {missing}")
            return [row[f.name] for f in self._fields]
        if hasattr(row, "index") and hasattr(row, "to_dict") and not isinstance(row, (tuple, list)):
            return self._as_sequence(row.to_dict())  # pandas Series / Row-like
        if not isinstance(row, (tuple, list)):
            if len(self._fields) != 1:
                raise StateSchemaError(f"state {self.state_name!r}: expected a tuple of "
                                       f"{len(self._fields)} values {self.schema.names}, got "
                                       f"{type(row).__name__}")
            row = (row,)
        if len(row) != len(self._fields):
            raise StateSchemaError(f"state {self.state_name!r}: expected {len(self._fields)} values "
                                   f"{self.schema.names}, got {len(row)}")
        return row


class FixedWidthCodec:
    """Numeric, non-null rows as packed little-endian numpy records: the built-in
    aggregates decode a whole multi-get in one `np.frombuffer`."""

    def __init__(self, state_name: str, fields: Sequence[tuple[str, str]]):
        self.state_name = state_name
        self.dtype = np.dtype([(name, np.dtype(kind).newbyteorder("<")) for name, kind in fields])

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def encode_many(self, records: np.ndarray) -> list[bytes]:
        buf = np.ascontiguousarray(records, dtype=self.dtype).tobytes()
        n = self.itemsize
        return [buf[i:i + n] for i in range(0, len(buf), n)]

    def decode_many(self, values: Sequence[bytes]) -> np.ndarray:
        if values and set(map(len, values)) != {self.itemsize}:
            bad = next(len(v) for v in values if len(v) != self.itemsize)
            raise StateSchemaError(f"state {self.state_name!r}: a stored value has {bad} bytes, the "
                                   f"declared layout {self.dtype.names} has {self.itemsize}; the state "
                                   "was written by another version of this operator")
        return np.frombuffer(b"".join(values), dtype=self.dtype)


__all__ = ["parse_schema", "RowCodec", "FixedWidthCodec", "CODEC_VERSION"]
