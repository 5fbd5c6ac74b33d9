"""Spark DDL and Spark types as the Arrow types state holds.

Two ways in, one result:
  - `spark_to_arrow` turns a parsed `pyspark.sql.types.DataType` (duck-typed: this
    module never imports pyspark) into Arrow: what Spark's own parser gives when a
    Spark session is running, and what a `StructType` declaration is;
  - `parse_ddl` parses the same DDL in Python, for where no JVM is (Spark's Python
    workers, the ProcessorTester). It accepts Spark's grammar for schemas: `name TYPE`
    or `name: TYPE` fields, `NOT NULL`, `COMMENT '...'`, backquoted names, and the
    types below, nested at will; tests/integration/test_state_ddl_spark.py holds it to
    Spark's parser on the same strings.

    Spark                                   Arrow
    BOOLEAN                                 bool
    TINYINT BYTE / SMALLINT SHORT           int8 / int16
    INT INTEGER / BIGINT LONG               int32 / int64
    FLOAT REAL / DOUBLE                     float32 / float64
    DECIMAL(p, s) DEC NUMERIC               decimal128(p, s) (DECIMAL alone: (10, 0))
    STRING, CHAR(n), VARCHAR(n)             string
    BINARY                                  binary
    DATE                                    date32
    TIMESTAMP, TIMESTAMP_LTZ                timestamp[us, UTC]
    TIMESTAMP_NTZ                           timestamp[us] (no time zone)
    ARRAY<T>                                list<T> (elements nullable)
    MAP<K, V>                               map<K, V> (values nullable)
    STRUCT<a: T [NOT NULL], ...>            struct<...>
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from sparkpoint.errors import StateSchemaError

MAX_DECIMAL_PRECISION = 38
UTC_TIMESTAMP = pa.timestamp("us", tz="UTC")
NTZ_TIMESTAMP = pa.timestamp("us")

_SIMPLE: dict[str, pa.DataType] = {
    "BOOLEAN": pa.bool_(),
    "TINYINT": pa.int8(), "BYTE": pa.int8(),
    "SMALLINT": pa.int16(), "SHORT": pa.int16(),
    "INT": pa.int32(), "INTEGER": pa.int32(),
    "BIGINT": pa.int64(), "LONG": pa.int64(),
    "FLOAT": pa.float32(), "REAL": pa.float32(),
    "DOUBLE": pa.float64(),
    "STRING": pa.string(),
    "BINARY": pa.binary(),
    "DATE": pa.date32(),
    "TIMESTAMP": UTC_TIMESTAMP, "TIMESTAMP_LTZ": UTC_TIMESTAMP,
    "TIMESTAMP_NTZ": NTZ_TIMESTAMP,
}
_DECIMALS = {"DECIMAL", "DEC", "NUMERIC"}
_LENGTHED = {"CHAR", "CHARACTER", "VARCHAR"}
SUPPORTED = sorted({*_SIMPLE, "DECIMAL(p, s)", "CHAR(n)", "VARCHAR(n)", "ARRAY<T>", "MAP<K, V>", "STRUCT<...>"})

# Spark DataType.typeName() -> Arrow, for the types without parameters or children
_SPARK_SIMPLE = {"boolean": pa.bool_(), "byte": pa.int8(), "short": pa.int16(), "integer": pa.int32(),
                 "long": pa.int64(), "float": pa.float32(), "double": pa.float64(), "string": pa.string(),
                 "char": pa.string(), "varchar": pa.string(), "binary": pa.binary(), "date": pa.date32(),
                 "timestamp": UTC_TIMESTAMP, "timestamp_ntz": NTZ_TIMESTAMP}


def list_of(element: pa.DataType, nullable: bool = True) -> pa.DataType:
    return pa.list_(pa.field("element", element, nullable=nullable))


def map_of(key: pa.DataType, value: pa.DataType, value_nullable: bool = True) -> pa.DataType:
    return pa.map_(pa.field("key", key, nullable=False), pa.field("value", value, nullable=value_nullable))


def decimal(precision: int, scale: int, what: str) -> pa.DataType:
    if not 1 <= precision <= MAX_DECIMAL_PRECISION or not 0 <= scale <= precision:
        raise StateSchemaError(f"{what}: DECIMAL({precision}, {scale}) is not a Spark decimal; the precision is "
                               f"1..{MAX_DECIMAL_PRECISION} and the scale 0..precision")
    return pa.decimal128(precision, scale)


def ddl_of(t: pa.DataType) -> str:
    """How Spark DDL writes an Arrow type state holds (for messages)."""
    names = {v: k for k, v in reversed(list(_SIMPLE.items()))}
    if t in names:
        return names[t]
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision}, {t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"ARRAY<{ddl_of(t.value_type)}>"
    if pa.types.is_map(t):
        return f"MAP<{ddl_of(t.key_type)}, {ddl_of(t.item_type)}>"
    if pa.types.is_struct(t):
        return "STRUCT<" + ", ".join(f"{f.name}: {ddl_of(f.type)}" for f in t) + ">"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP" if t.tz else "TIMESTAMP_NTZ"
    return str(t)


# -- Spark types (already parsed, by Spark or by the user) -----------------------------------
def spark_to_arrow(data_type: Any, what: str) -> pa.DataType:
    name = data_type.typeName()
    if name in _SPARK_SIMPLE:
        return _SPARK_SIMPLE[name]
    if name == "decimal":
        return decimal(int(data_type.precision), int(data_type.scale), what)
    if name == "array":
        return list_of(spark_to_arrow(data_type.elementType, what), bool(data_type.containsNull))
    if name == "map":
        return map_of(spark_to_arrow(data_type.keyType, what), spark_to_arrow(data_type.valueType, what),
                      bool(data_type.valueContainsNull))
    if name == "struct":
        return pa.struct(spark_fields(data_type, what))
    raise StateSchemaError(f"{what}: Spark type {data_type.simpleString().upper()} is not one state can hold; "
                           f"use one of {', '.join(SUPPORTED)}")


def spark_fields(struct: Any, what: str) -> list[pa.Field]:
    fields = [pa.field(f.name, spark_to_arrow(f.dataType, f"{what}, field {f.name!r}"), nullable=bool(f.nullable))
              for f in struct.fields]
    return _unique(fields, what)


def _unique(fields: list[pa.Field], what: str) -> list[pa.Field]:
    names = [f.name for f in fields]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise StateSchemaError(f"{what}: duplicate field names {twice}")
    return fields


# -- the Python parser ----------------------------------------------------------------------
_TOKEN = re.compile(r"""\s*(?:
      (?P<quoted>`(?:[^`]|``)*`)
    | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
    | (?P<word>[A-Za-z0-9_]+)
    | (?P<punct>[<>(),:])
    )""", re.VERBOSE)


class _Tokens:
    def __init__(self, text: str, what: str):
        self.text, self.what = text, what
        self.items: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                self.fail(f"unexpected {text[pos:].strip()[:20]!r}")
            kind = m.lastgroup
            self.items.append((kind, m.group(kind)))  # type: ignore[arg-type]
            pos = m.end()
        self.i = 0

    def fail(self, problem: str) -> None:
        raise StateSchemaError(f"{self.what}: cannot parse {self.text!r}: {problem}; write fields as 'name TYPE' "
                               "(e.g. 'count BIGINT, total DECIMAL(12, 2), tags ARRAY<STRING>')")

    def peek(self) -> str | None:
        return self.items[self.i][1] if self.i < len(self.items) else None

    def peek_word(self) -> str | None:
        tok = self.peek()
        return tok.upper() if tok is not None and self.items[self.i][0] == "word" else None

    def take(self) -> tuple[str, str]:
        if self.i >= len(self.items):
            self.fail("it ends too early")
        tok = self.items[self.i]
        self.i += 1
        return tok

    def expect(self, punct: str) -> None:
        kind, value = self.take()
        if value != punct:
            self.fail(f"expected {punct!r}, found {value!r}")

    def accept(self, punct: str) -> bool:
        if self.peek() == punct and self.items[self.i][0] == "punct":
            self.i += 1
            return True
        return False

    def integer(self) -> int:
        kind, value = self.take()
        if kind != "word" or not value.isdigit():
            self.fail(f"expected a number, found {value!r}")
        return int(value)

    def name(self) -> str:
        kind, value = self.take()
        if kind == "quoted":
            return value[1:-1].replace("``", "`")
        if kind != "word" or value.isdigit():
            self.fail(f"expected a field name, found {value!r}")
        return value


def parse_ddl(ddl: str, what: str = "schema") -> list[pa.Field]:
    """The fields of a schema in Spark DDL ("count BIGINT NOT NULL, tags ARRAY<STRING>",
    or one "STRUCT<...>"). Raises StateSchemaError naming `what` and the problem."""
    tokens = _Tokens(ddl, what)
    if tokens.peek() is None:
        tokens.fail("it is empty")
    if tokens.peek_word() == "STRUCT" and tokens.i + 1 < len(tokens.items) and tokens.items[1][1] == "<":
        t = _type(tokens, what)
        if tokens.peek() is not None:
            tokens.fail(f"unexpected {tokens.peek()!r} after the struct")
        return list(t)  # type: ignore[call-overload]
    fields = [_field(tokens, what)]
    while tokens.accept(","):
        fields.append(_field(tokens, what))
    if tokens.peek() is not None:
        tokens.fail(f"unexpected {tokens.peek()!r}")
    return _unique(fields, what)


def _field(tokens: _Tokens, what: str) -> pa.Field:
    name = tokens.name()
    tokens.accept(":")
    if tokens.peek() is None or tokens.peek() == ",":
        tokens.fail(f"field {name!r} has no type")
    data_type = _type(tokens, f"{what}, field {name!r}")
    nullable = True
    while (word := tokens.peek_word()) in ("NOT", "COMMENT"):
        tokens.take()
        if word == "NOT":
            if tokens.peek_word() != "NULL":
                tokens.fail(f"expected NULL after NOT in field {name!r}")
            tokens.take()
            nullable = False
        else:
            kind, _ = tokens.take()
            if kind != "string":
                tokens.fail(f"expected a quoted comment after COMMENT in field {name!r}")
    return pa.field(name, data_type, nullable=nullable)


def _type(tokens: _Tokens, what: str) -> pa.DataType:
    kind, value = tokens.take()
    word = value.upper()
    if kind != "word":
        tokens.fail(f"expected a type, found {value!r}")
    if word in _SIMPLE:
        return _SIMPLE[word]
    if word in _DECIMALS:
        precision, scale = 10, 0
        if tokens.accept("("):
            precision = tokens.integer()
            if tokens.accept(","):
                scale = tokens.integer()
            tokens.expect(")")
        return decimal(precision, scale, what)
    if word in _LENGTHED:
        tokens.expect("(")
        tokens.integer()
        tokens.expect(")")
        return pa.string()
    if word == "ARRAY":
        tokens.expect("<")
        element = _type(tokens, what)
        tokens.expect(">")
        return list_of(element)
    if word == "MAP":
        tokens.expect("<")
        key = _type(tokens, what)
        tokens.expect(",")
        value_type = _type(tokens, what)
        tokens.expect(">")
        return map_of(key, value_type)
    if word == "STRUCT":
        tokens.expect("<")
        fields: list[pa.Field] = []
        if not tokens.accept(">"):
            fields.append(_field(tokens, what))
            while tokens.accept(","):
                fields.append(_field(tokens, what))
            tokens.expect(">")
        return pa.struct(_unique(fields, what))
    raise StateSchemaError(f"{what}: type {value.upper()} is not one state can hold; use one of "
                           f"{', '.join(SUPPORTED)}")


__all__ = ["parse_ddl", "spark_to_arrow", "spark_fields", "SUPPORTED", "UTC_TIMESTAMP", "NTZ_TIMESTAMP"]
