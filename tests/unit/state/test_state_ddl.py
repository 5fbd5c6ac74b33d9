"""The Python DDL parser: Spark's grammar for schemas, into the Arrow types state holds.
tests/integration/test_state_ddl_spark.py holds it to Spark's own parser on the same strings."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkpoint.errors import StateSchemaError
from sparkpoint.state.codec import parse_schema
from sparkpoint.state.ddl import list_of, map_of, parse_ddl

# Shared with the integration test that parses each of them with Spark too.
AGREED_DDL = [
    "count BIGINT NOT NULL, `total` DOUBLE, label string, seen Long",
    "price DECIMAL(12, 2), big DECIMAL(38,0), plain DECIMAL, dec5 DEC(5), num NUMERIC(7, 3)",
    "day DATE, at TIMESTAMP, local TIMESTAMP_NTZ, ltz TIMESTAMP_LTZ",
    "tags ARRAY<STRING>, matrix ARRAY<ARRAY<INT>>, days array<date>",
    "totals MAP<STRING, DECIMAL(10, 2)>, by_day MAP<DATE, ARRAY<BIGINT>>",
    "address STRUCT<street: STRING, zip INT NOT NULL, geo: STRUCT<lat DOUBLE, lon DOUBLE>>",
    "a: tinyint, b: smallint, c: int, d: bigint, e: float, f: double, g: boolean, h: binary",
    "`odd name` INT, `with``tick` STRING COMMENT 'a comment', n INT NOT NULL COMMENT \"why\"",
    "code CHAR(3), note VARCHAR(20), r REAL, s SHORT, y BYTE, i INTEGER",
    "STRUCT<a: INT, b: ARRAY<STRUCT<c: DATE, d: MAP<STRING, TIMESTAMP_NTZ>>>>",
    "events ARRAY<STRUCT<at: TIMESTAMP, amount: DECIMAL(18, 4) NOT NULL>>",
]
REFUSED_DDL = [
    "count BIGINT, total MONEY",
    "just_a_name",
    "a INT, a INT",
    "m MAP<STRING>",
    "x ARRAY<INT",
    "d DECIMAL(39, 2)",
    "d DECIMAL(5, 6)",
    "a INT,",
    "i INTERVAL DAY",
    "INT",
    "flag BOOL",      # sparkpoint's own parser took these two before; Spark never did
    "name VARCHAR",
]


def test_flat_nested_and_parameterized_types_parse_to_their_arrow_types() -> None:
    schema = parse_schema("price DECIMAL(12, 2) NOT NULL, day DATE, at TIMESTAMP, local TIMESTAMP_NTZ, "
                          "tags ARRAY<STRING>, totals MAP<STRING, BIGINT>, "
                          "address STRUCT<street: STRING, zip INT NOT NULL>")
    assert schema == pa.schema([
        pa.field("price", pa.decimal128(12, 2), nullable=False),
        pa.field("day", pa.date32()),
        pa.field("at", pa.timestamp("us", tz="UTC")),
        pa.field("local", pa.timestamp("us")),
        pa.field("tags", list_of(pa.string())),
        pa.field("totals", map_of(pa.string(), pa.int64())),
        pa.field("address", pa.struct([pa.field("street", pa.string()), pa.field("zip", pa.int32(), False)])),
    ])


def test_a_struct_at_the_top_is_its_fields() -> None:
    assert parse_ddl("STRUCT<a: INT, b DATE>") == parse_ddl("a INT, b DATE")


def test_decimal_defaults_and_aliases_follow_spark() -> None:
    schema = parse_schema("a DECIMAL, b DEC(5), c NUMERIC(7, 3)")
    assert schema.types == [pa.decimal128(10, 0), pa.decimal128(5, 0), pa.decimal128(7, 3)]


def test_backquoted_names_comments_and_the_colon_form() -> None:
    schema = parse_schema("`odd name` INT, `with``tick` STRING COMMENT 'a, comment', n: INT NOT NULL")
    assert schema.names == ["odd name", "with`tick", "n"]
    assert not schema.field("n").nullable


@pytest.mark.parametrize("ddl", AGREED_DDL)
def test_every_shared_ddl_string_parses(ddl: str) -> None:
    assert len(parse_schema(ddl)) >= 1


@pytest.mark.parametrize("ddl, message", [
    ("count BIGINT, total MONEY", "type MONEY is not one state can hold"),
    ("just_a_name", "field 'just_a_name' has no type"),
    ("a INT, a INT", "duplicate field names \\['a'\\]"),
    ("m MAP<STRING>", "expected ','"),
    ("x ARRAY<INT", "it ends too early"),
    ("d DECIMAL(39, 2)", "DECIMAL\\(39, 2\\) is not a Spark decimal"),
    ("i INTERVAL DAY", "type INTERVAL is not one state can hold"),
])
def test_bad_ddl_is_one_line_naming_the_problem(ddl: str, message: str) -> None:
    with pytest.raises(StateSchemaError, match=message) as e:
        parse_schema(ddl, "state 'x'")
    assert str(e.value).startswith("state 'x'") and "\n" not in str(e.value)


@pytest.mark.parametrize("ddl", REFUSED_DDL)
def test_every_shared_refused_string_is_refused(ddl: str) -> None:
    with pytest.raises(StateSchemaError):
        parse_schema(ddl)
