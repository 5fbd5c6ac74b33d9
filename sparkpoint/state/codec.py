"""State value encoding from declared schemas. Never pickle: values are msgpack (one
version byte, then the row as a list in schema order) or, for the built-in numeric
aggregates, fixed-width numpy records.

Each Arrow type has one plain form msgpack carries, so equal values encode to equal
bytes (map state relies on it for its keys):

    integers, floats, strings, booleans, binary   themselves
    DECIMAL(p, s)                                 the unscaled integer (bytes, big-endian
                                                  two's complement, past 64 bits)
    DATE                                          days since 1970-01-01
    TIMESTAMP / TIMESTAMP_NTZ                     microseconds since 1970-01-01 (UTC / wall clock)
    ARRAY<T>                                      a list of T's forms
    MAP<K, V>                                     a list of [key, value] pairs, in the map's order
    STRUCT<...>                                   a list of the fields' forms, in field order

and decodes to Python objects, as Spark's `collect()` gives them: int, float, str,
bool, bytes, `decimal.Decimal` (at the declared scale), `datetime.date`, an aware UTC
`datetime` for TIMESTAMP (collect: naive, local) and a naive one for TIMESTAMP_NTZ,
list, dict, and a tuple for a struct (as a state row is a tuple).

A schema may be declared as a `pyarrow.Schema`, a Spark DDL string
("count BIGINT, total DECIMAL(12, 2)") or a `pyspark.sql.types.StructType` (duck-typed,
so this module never imports pyspark). DDL is parsed by Spark's own parser while a
Spark session runs in this process, else by `sparkpoint.state.ddl`, which agrees with it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import msgpack
import numpy as np
import pyarrow as pa

from sparkpoint.errors import StateSchemaError
from sparkpoint.state.ddl import parse_ddl, spark_fields

CODEC_VERSION = 1
_VERSION_BYTE = bytes([CODEC_VERSION])
_UTC = dt.timezone.utc
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_NAIVE_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DAY = dt.date(1970, 1, 1)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_MAX_DIGITS = 40  # past DECIMAL(38, s): quantizing and scaling never round

SchemaLike = Any  # pa.Schema | str | pyspark StructType


def parse_schema(decl: SchemaLike, what: str = "schema") -> pa.Schema:
    """Turn a declared schema into a pyarrow schema. Raises StateSchemaError naming
    `what` and the offending field."""
    if isinstance(decl, pa.Schema):
        return decl
    if isinstance(decl, str):
        return _parse_ddl_string(decl, what, _spark_is_running())
    if hasattr(decl, "fields"):  # pyspark StructType
        return pa.schema(spark_fields(decl, what))
    raise StateSchemaError(f"{what}: expected a pyarrow.Schema, a DDL string or a StructType, "
                           f"got {type(decl).__name__}")


def _spark_is_running() -> bool:
    """A Spark session with a JVM in this process (the driver); never in a Python worker."""
    if "pyspark" not in sys.modules:
        return False
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None


@functools.lru_cache(maxsize=256)
def _parse_ddl_string(ddl: str, what: str, with_spark: bool) -> pa.Schema:
    if with_spark:
        return parse_with_spark(ddl, what)
    return pa.schema(parse_ddl(ddl, what))


def parse_with_spark(ddl: str, what: str) -> pa.Schema:
    """`ddl` parsed by Spark's own DDL parser (needs a running session). A refusal is
    worded as the Python parser words it (both refuse the same strings:
    tests/integration/test_state_ddl_spark.py), so one mistake gives one message whether
    or not a session runs in the process."""
    from pyspark.sql.types import _parse_datatype_string

    try:
        parsed = _parse_datatype_string(ddl)
        if parsed.typeName() != "struct":
            raise StateSchemaError(f"{what}: cannot parse {ddl!r}: it is a type, not fields; write fields as "
                                   "'name TYPE' (e.g. 'count BIGINT, total DECIMAL(12, 2), tags ARRAY<STRING>')")
        return pa.schema(spark_fields(parsed, what))
    except Exception as e:  # Spark's ParseException and friends, or a type state cannot hold
        parse_ddl(ddl, what)  # raises the Python parser's words for the same refusal
        if isinstance(e, StateSchemaError):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StateSchemaError(f"{what}: cannot parse {ddl!r}: {first}; write fields as 'name TYPE' (e.g. "
                               "'count BIGINT, total DECIMAL(12, 2), tags ARRAY<STRING>')") from None


# -- per-type codecs: Python value <-> the plain form msgpack carries ------------------------
_INT_BOUNDS = {8: (-(1 << 7), (1 << 7) - 1), 16: (-(1 << 15), (1 << 15) - 1),
               32: (-(1 << 31), (1 << 31) - 1), 64: (-(1 << 63), (1 << 63) - 1)}


class _Bad(TypeError):
    """A value that does not fit its type; the message says where inside it."""


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_missing(v: Any, t: pa.DataType) -> bool:
    """None, pandas NA/NaT, or NaN standing in for a missing non-float value (pandas)."""
    if v is None or type(v).__name__ in ("NAType", "NaTType"):
        return True
    return isinstance(v, (float, np.floating)) and v != v and not pa.types.is_floating(t)


@dataclass(frozen=True)
class _TypeCodec:
    type: pa.DataType
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


def _int_codec(t: pa.DataType) -> _TypeCodec:
    lo, hi = _INT_BOUNDS[t.bit_width]

    def enc(v: Any) -> int:
        if not _is_int(v):
            raise _Bad(f"expected an integer, got {type(v).__name__}")
        if not lo <= int(v) <= hi:
            raise _Bad(f"{v} does not fit in {t}")
        return int(v)
    return _TypeCodec(t, enc, _stored(int))


def _float_enc(v: Any) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise _Bad(f"expected a number, got {type(v).__name__}")
    return float(v)


def _str_enc(v: Any) -> str:
    if not isinstance(v, str):
        raise _Bad(f"expected a string, got {type(v).__name__}")
    return v


def _bool_enc(v: Any) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise _Bad(f"expected a boolean, got {type(v).__name__}")
    return bool(v)


def _bytes_enc(v: Any) -> bytes:
    if not isinstance(v, (bytes, bytearray, memoryview)):
        raise _Bad(f"expected bytes, got {type(v).__name__}")
    return bytes(v)


def _stored(expected: type) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if not isinstance(v, expected) or (expected is int and isinstance(v, bool)):
            raise _Bad(f"found {type(v).__name__}")
        return v
    return check


def _timestamp_codec(t: pa.TimestampType) -> _TypeCodec:
    """TIMESTAMP (a time zone): an instant, naive datetimes read as UTC. TIMESTAMP_NTZ
    (none): a wall-clock time, a time zone ignored as Spark ignores it."""
    instant = t.tz is not None

    def enc(v: Any) -> int:
        if isinstance(v, np.datetime64):
            return int(v.astype("datetime64[us]").astype(np.int64))
        if isinstance(v, dt.datetime):  # includes pandas.Timestamp
            if instant:
                aware = v if v.tzinfo is not None else v.replace(tzinfo=_UTC)
                return (aware - _EPOCH) // dt.timedelta(microseconds=1)
            return (v.replace(tzinfo=None) - _NAIVE_EPOCH) // dt.timedelta(microseconds=1)
        if _is_int(v):
            return int(v)
        raise _Bad(f"expected a datetime or microseconds since 1970, got {type(v).__name__}")

    def dec(v: Any) -> dt.datetime:
        if not isinstance(v, int):
            raise _Bad(f"expected microseconds, found {type(v).__name__}")
        return (_EPOCH if instant else _NAIVE_EPOCH) + dt.timedelta(microseconds=v)
    return _TypeCodec(t, enc, dec)


def _date_enc(v: Any) -> int:
    if isinstance(v, np.datetime64):
        return int(v.astype("datetime64[D]").astype(np.int64))
    if isinstance(v, dt.datetime):  # a pandas.Timestamp too: a date only if it is midnight
        if v.time() != dt.time(0) or v.tzinfo is not None:
            raise _Bad(f"expected a date, got the time {v}")
        return (v.date() - _EPOCH_DAY).days
    if isinstance(v, dt.date):
        return (v - _EPOCH_DAY).days
    if _is_int(v):
        return int(v)
    raise _Bad(f"expected a date or days since 1970, got {type(v).__name__}")


def _date_dec(v: Any) -> dt.date:
    if not isinstance(v, int):
        raise _Bad(f"expected days, found {type(v).__name__}")
    return _EPOCH_DAY + dt.timedelta(days=v)


def _decimal_codec(t: pa.Decimal128Type) -> _TypeCodec:
    precision, scale = t.precision, t.scale
    quantum = decimal.Decimal(1).scaleb(-scale)
    context = decimal.Context(prec=_MAX_DIGITS)

    def enc(v: Any) -> Any:
        if _is_int(v):
            v = decimal.Decimal(int(v))
        if not isinstance(v, decimal.Decimal) or not v.is_finite():
            raise _Bad(f"expected a decimal.Decimal or an integer, got {v!r}")
        try:
            exact = v.quantize(quantum, context=context)
        except decimal.InvalidOperation:
            raise _Bad(f"{v} has more than {precision} digits") from None
        if exact != v:
            raise _Bad(f"{v} has more than {scale} digits after the point")
        unscaled = int(exact.scaleb(scale, context=context))
        if len(str(abs(unscaled))) > precision:
            raise _Bad(f"{v} has more than {precision} digits")
        if _INT64_MIN <= unscaled <= _INT64_MAX:
            return unscaled
        return unscaled.to_bytes(17, "big", signed=True)

    def dec(v: Any) -> decimal.Decimal:
        if isinstance(v, bytes):
            v = int.from_bytes(v, "big", signed=True)
        if not isinstance(v, int) or isinstance(v, bool):
            raise _Bad(f"expected an unscaled decimal, found {type(v).__name__}")
        return decimal.Decimal(v).scaleb(-scale, context=context)
    return _TypeCodec(t, enc, dec)



def _list_codec(t: pa.ListType, what: str) -> _TypeCodec:
    element = t.value_field
    inner = type_codec(element.type, what)

    def enc(v: Any) -> list:
        if isinstance(v, (str, bytes, Mapping)) or not hasattr(v, "__iter__"):
            raise _Bad(f"expected a list, got {type(v).__name__}")
        out = []
        for i, item in enumerate(v):
            out.append(_encode_nested(inner, element.nullable, item, f"element {i}"))
        return out

    def dec(v: Any) -> list:
        if not isinstance(v, list):
            raise _Bad(f"expected a list, found {type(v).__name__}")
        return [_decode_nested(inner, element.nullable, item, f"element {i}") for i, item in enumerate(v)]
    return _TypeCodec(t, enc, dec)


def _map_codec(t: pa.MapType, what: str) -> _TypeCodec:
    if _has_collection(t.key_type):
        raise StateSchemaError(f"{what}: a MAP whose keys are {t.key_type}; map keys cannot hold an ARRAY or a MAP "
                               "(they must hash as one value): use flat types or STRUCTs of them")
    key, value = type_codec(t.key_type, what), type_codec(t.item_type, what)
    value_nullable = t.item_field.nullable

    def enc(v: Any) -> list:
        pairs = v.items() if isinstance(v, Mapping) else v  # Arrow's pandas form: a list of (key, value)
        if isinstance(v, (str, bytes)) or not hasattr(pairs, "__iter__"):
            raise _Bad(f"expected a dict, got {type(v).__name__}")
        out = []
        for pair in pairs:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise _Bad(f"expected a dict or (key, value) pairs, got {type(v).__name__}")
            out.append([_encode_nested(key, False, pair[0], "map key"),
                        _encode_nested(value, value_nullable, pair[1], f"value of key {pair[0]!r}")])
        return out

    def dec(v: Any) -> dict:
        if not isinstance(v, list):
            raise _Bad(f"expected map entries, found {type(v).__name__}")
        return {_decode_nested(key, False, k, "map key"): _decode_nested(value, value_nullable, x, "map value")
                for k, x in v}
    return _TypeCodec(t, enc, dec)


def _struct_codec(t: pa.StructType, what: str) -> _TypeCodec:
    fields = [t.field(i) for i in range(t.num_fields)]
    inner = [type_codec(f.type, what) for f in fields]
    names = [f.name for f in fields]

    def enc(v: Any) -> list:
        values = _row_values(v, names, _Bad)
        return [_encode_nested(c, f.nullable, x, f"field {f.name!r}") for c, f, x in zip(inner, fields, values)]

    def dec(v: Any) -> tuple:
        if isinstance(v, list) and len(v) < len(fields) and all(f.nullable for f in fields[len(v):]):
            v = v + [None] * (len(fields) - len(v))  # written before its last nullable fields were added
        if not isinstance(v, list) or len(v) != len(fields):
            raise _Bad(f"expected a struct of {len(fields)} fields, found {v!r}")
        return tuple(_decode_nested(c, f.nullable, x, f"field {f.name!r}") for c, f, x in zip(inner, fields, v))
    return _TypeCodec(t, enc, dec)


def _encode_nested(codec: _TypeCodec, nullable: bool, v: Any, where: str) -> Any:
    if _is_missing(v, codec.type):
        if not nullable:
            raise _Bad(f"{where} is NOT NULL but the value is missing")
        return None
    try:
        return codec.encode(v)
    except _Bad as e:
        raise _Bad(f"{where}: {e}") from None


def _decode_nested(codec: _TypeCodec, nullable: bool, v: Any, where: str) -> Any:
    if v is None:
        if not nullable:
            raise _Bad(f"{where} is NOT NULL but the stored value is null")
        return None
    try:
        return codec.decode(v)
    except _Bad as e:
        raise _Bad(f"{where}: {e}") from None


def type_codec(t: pa.DataType, what: str) -> _TypeCodec:
    """The codec of one Arrow type; StateSchemaError naming `what` for a type state cannot hold."""
    if pa.types.is_integer(t):
        return _int_codec(t)
    if pa.types.is_floating(t) and t.bit_width in (32, 64):
        return _TypeCodec(t, _float_enc, _stored(float))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _TypeCodec(t, _str_enc, _stored(str))
    if pa.types.is_boolean(t):
        return _TypeCodec(t, _bool_enc, _stored(bool))
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return _TypeCodec(t, _bytes_enc, _stored(bytes))
    if pa.types.is_timestamp(t):
        return _timestamp_codec(t)
    if pa.types.is_date32(t):
        return _TypeCodec(t, _date_enc, _date_dec)
    if pa.types.is_decimal128(t):
        return _decimal_codec(t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _list_codec(t, what)
    if pa.types.is_map(t):
        return _map_codec(t, what)
    if pa.types.is_struct(t):
        return _struct_codec(t, what)
    raise StateSchemaError(f"{what} has type {t}, which state cannot hold; declare it in Spark DDL (BIGINT, "
                           "DOUBLE, DECIMAL(p, s), STRING, DATE, TIMESTAMP, TIMESTAMP_NTZ, ARRAY<...>, MAP<...>, "
                           "STRUCT<...>, ...)")


def _row_values(row: Any, names: list[str], error: type[Exception]) -> Sequence[Any]:
    """A row (tuple, list, dict, pandas Series or Row, or one value for one column) as its
    values in `names` order."""
    if isinstance(row, Mapping):
        missing = [n for n in names if n not in row]
        if missing:
            raise error(f"value lacks field(s) {missing}")
        return [row[n] for n in names]
    if hasattr(row, "index") and hasattr(row, "to_dict") and not isinstance(row, (tuple, list)):
        return _row_values(row.to_dict(), names, error)  # pandas Series
    if not isinstance(row, (tuple, list)):
        if len(names) != 1:
            raise error(f"expected a tuple of {len(names)} values {names}, got {type(row).__name__}")
        row = (row,)
    if len(row) != len(names):
        raise error(f"expected {len(names)} values {names}, got {len(row)}")
    return row


@dataclass(frozen=True)
class _FieldCodec:
    name: str
    nullable: bool
    codec: _TypeCodec

    @property
    def type(self) -> pa.DataType:
        return self.codec.type


def _has_collection(t: pa.DataType) -> bool:
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        return True
    return pa.types.is_struct(t) and any(_has_collection(t.field(i).type) for i in range(t.num_fields))


def require_hashable(schema: pa.Schema, what: str) -> None:
    """Map keys (a map state's, or a MAP's) come back as dict keys: no lists or maps in them."""
    for f in schema:
        if _has_collection(f.type):
            raise StateSchemaError(f"{what}: field {f.name!r} is {f.type}; a map key cannot hold an ARRAY or a "
                                   "MAP (it must compare and hash as one value): use flat fields or STRUCTs of them")


class RowCodec:
    """Encodes one row (tuple, list, dict or pandas Series) of a declared schema.

    Raises StateSchemaError naming the state and the field on a wrong arity, type or
    null, both when encoding and when decoding (a value written under another schema)."""

    def __init__(self, state_name: str, schema: SchemaLike):
        self.state_name = state_name
        self.schema = parse_schema(schema, f"state {state_name!r}")
        self._fields = [_FieldCodec(f.name, f.nullable, type_codec(f.type, f"state {state_name!r}, field {f.name!r}"))
                        for f in self.schema]

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
                out.append(f.codec.encode(v))
            except _Bad as e:
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
        if isinstance(values, list) and len(values) < len(self._fields) and \
                all(f.nullable for f in self._fields[len(values):]):
            # Written before the nullable fields after it were added (sparkpoint.state.evolution).
            values = values + [None] * (len(self._fields) - len(values))
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
                out.append(f.codec.decode(v))
            except _Bad as e:
                raise StateSchemaError(f"state {self.state_name!r}: stored field {f.name!r} does not "
                                       f"match {f.type}: {e}") from None
        return tuple(out)

    def _as_sequence(self, row: Any) -> Sequence[Any]:
        try:
            return _row_values(row, [f.name for f in self._fields], _Bad)
        except _Bad as e:
            raise StateSchemaError(f"state {self.state_name!r}: {e}") from None


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
