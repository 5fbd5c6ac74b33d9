from __future__ import annotations

import datetime as dt
from decimal import Decimal

import msgpack
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from sparkpoint.errors import StateSchemaError
from sparkpoint.state.codec import FixedWidthCodec, RowCodec, parse_schema

UTC = dt.timezone.utc
NESTED = ("price DECIMAL(10, 2), big DECIMAL(38, 0), day DATE, at TIMESTAMP, local TIMESTAMP_NTZ, days ARRAY<DATE>, "
          "rates MAP<STRING, DECIMAL(6, 2)>, address STRUCT<street: STRING, zip: INT, fees: ARRAY<DECIMAL(4, 2)>>, "
          "lines ARRAY<STRUCT<at: TIMESTAMP, qty: INT>>")
ALL_TYPES = "id BIGINT, n INT, ratio DOUBLE, f FLOAT, name STRING, ok BOOLEAN, at TIMESTAMP, blob BINARY"


def test_ddl_parses_the_common_spark_types() -> None:
    schema = parse_schema("count BIGINT NOT NULL, `total` DOUBLE, label string, seen Long")
    assert schema.names == ["count", "total", "label", "seen"]
    assert schema.types == [pa.int64(), pa.float64(), pa.string(), pa.int64()]
    assert not schema.field("count").nullable and schema.field("total").nullable


def test_spark_struct_type_is_accepted() -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = parse_schema(StructType([StructField("n", LongType(), False), StructField("s", StringType())]))
    assert schema == pa.schema([pa.field("n", pa.int64(), nullable=False), pa.field("s", pa.string())])


@pytest.mark.parametrize("ddl, message", [
    ("count BIGINT, total MONEY", "field 'total'.*type MONEY"),
    ("just_a_name", "field 'just_a_name' has no type"),
    ("a INT, a INT", "duplicate"),
])
def test_bad_ddl_names_the_problem(ddl: str, message: str) -> None:
    with pytest.raises(StateSchemaError, match=message):
        parse_schema(ddl, "state 'x'")


def test_round_trip_of_every_type_including_numpy_scalars_and_nulls() -> None:
    codec = RowCodec("everything", ALL_TYPES)
    at = dt.datetime(2026, 11, 23, 1, 2, 3, 456789, tzinfo=UTC)
    row = (np.int64(2**62), np.int32(-7), 0.25, np.float32(1.5), "héllo", np.bool_(True), at, b"\x00\xff")
    assert codec.decode(codec.encode(row)) == (2**62, -7, 0.25, 1.5, "héllo", True, at, b"\x00\xff")
    nulls = (None,) * 8
    assert codec.decode(codec.encode(nulls)) == nulls
    assert codec.decode(codec.encode({"id": 1, "n": 2, "ratio": 3, "f": 4.0, "name": "x", "ok": False,
                                      "at": None, "blob": None}))[2] == 3.0


def test_nested_and_parameterized_types_round_trip_to_the_values_spark_collects() -> None:
    codec = RowCodec("order", NESTED)
    row = (Decimal("12.5"), Decimal(10) ** 37, dt.date(2026, 11, 26), dt.datetime(2026, 11, 26, 8, 30, tzinfo=UTC),
           dt.datetime(2026, 11, 26, 8, 30), [dt.date(2026, 1, 1), None], {"eur": Decimal("1.25"), "usd": None},
           ("Main St", 12345, [Decimal("-0.01")]), [{"at": dt.datetime(2026, 1, 1, tzinfo=UTC), "qty": 3}])
    back = codec.decode(codec.encode(row))
    assert back == (Decimal("12.50"), Decimal(10) ** 37, dt.date(2026, 11, 26),
                    dt.datetime(2026, 11, 26, 8, 30, tzinfo=UTC), dt.datetime(2026, 11, 26, 8, 30),
                    [dt.date(2026, 1, 1), None], {"eur": Decimal("1.25"), "usd": None},
                    ("Main St", 12345, [Decimal("-0.01")]), [(dt.datetime(2026, 1, 1, tzinfo=UTC), 3)])
    assert str(back[0]) == "12.50"  # at the declared scale, as Spark collects it
    assert back[4].tzinfo is None  # TIMESTAMP_NTZ is a wall-clock time
    # exact: the largest DECIMAL(38, 0) and the smallest step of a scale survive
    extreme = RowCodec("x", "a DECIMAL(38, 0), b DECIMAL(38, 38), c DATE")
    values = (Decimal("-" + "9" * 38), Decimal("0." + "0" * 37 + "1"), dt.date(1, 1, 1))
    assert extreme.decode(extreme.encode(values)) == values


def test_nested_values_given_as_pandas_gives_them_round_trip() -> None:
    """Rows taken from a pandas frame of Arrow data: arrays are numpy arrays, maps are
    lists of pairs, structs are dicts, dates are datetime.date or Timestamps."""
    table = pa.table({"tags": pa.array([["a", "b"]]), "m": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())),
                      "s": pa.array([{"x": 1, "y": "z"}]), "day": pa.array([dt.date(2026, 1, 2)])})
    row = table.to_pandas().iloc[0]
    codec = RowCodec("p", "tags ARRAY<STRING>, m MAP<STRING, BIGINT>, s STRUCT<x: BIGINT, y: STRING>, day DATE")
    assert codec.decode(codec.encode(row)) == (["a", "b"], {"k": 1}, (1, "z"), dt.date(2026, 1, 2))
    assert codec.decode(codec.encode({"tags": np.array(["q"]), "m": {}, "s": None,
                                      "day": pd.Timestamp("2026-01-03")})) == (["q"], {}, None, dt.date(2026, 1, 3))


def test_equal_values_encode_to_equal_bytes() -> None:
    """Map state finds an entry by its key's bytes."""
    codec = RowCodec("k", "amount DECIMAL(10, 2), day DATE, parts STRUCT<a: INT, b: STRING>")
    assert codec.encode((Decimal("1.5"), dt.date(2026, 1, 1), (1, "x"))) == \
        codec.encode((Decimal("1.50"), pd.Timestamp("2026-01-01"), {"b": "x", "a": 1}))


@pytest.mark.parametrize("row, message", [
    ((Decimal("1.234"), None, None, None), "field 'd' .*1.234 has more than 2 digits after the point"),
    ((Decimal("123456789.1"), None, None, None), "field 'd' .*has more than 10 digits"),
    ((1.5, None, None, None), "field 'd' .*expected a decimal.Decimal or an integer"),
    ((None, dt.datetime(2026, 1, 1, 12), None, None), "field 'day' .*expected a date, got the time"),
    ((None, None, [1, "x"], None), "field 'xs' .*element 1: expected an integer, got str"),
    ((None, None, None, {"a": None}), "field 's' .*field 'a' is NOT NULL"),
])
def test_nested_encoding_errors_name_the_state_field_and_place(row: tuple, message: str) -> None:
    codec = RowCodec("totals", "d DECIMAL(10, 2), day DATE, xs ARRAY<BIGINT>, s STRUCT<a: INT NOT NULL>")
    with pytest.raises(StateSchemaError, match="state 'totals': " + message):
        codec.encode(row)


def test_a_map_key_holding_a_collection_is_refused_at_declaration() -> None:
    with pytest.raises(StateSchemaError, match="field 'm'.*map keys cannot hold an ARRAY or a MAP"):
        RowCodec("x", "m MAP<ARRAY<INT>, STRING>")


def test_values_written_before_nested_types_existed_still_decode() -> None:
    """The version byte and the flat forms are unchanged: old state reads as it did."""
    stored = bytes([1]) + msgpack.packb([7, 1.5, "x", True, 1_700_000_000_000_000, b"\x01"], use_bin_type=True)
    codec = RowCodec("old", "a BIGINT, b DOUBLE, c STRING, d BOOLEAN, e TIMESTAMP, f BINARY")
    assert codec.decode(stored) == (7, 1.5, "x", True, dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC), b"\x01")


def test_naive_datetimes_are_utc() -> None:
    codec = RowCodec("t", "at TIMESTAMP")
    assert codec.decode(codec.encode((dt.datetime(2020, 1, 1),))) == (dt.datetime(2020, 1, 1, tzinfo=UTC),)


@pytest.mark.parametrize("row, message", [
    ((1, 2), "expected 3 values"),
    ((1, "two", 3.0), "field 'b' \\(int32\\): expected an integer, got str"),
    ((1, 2**40, 3.0), "field 'b' .*does not fit in int32"),
    ((None, 2, 3.0), "field 'a' is NOT NULL"),
    ((True, 2, 3.0), "field 'a' .*expected an integer, got bool"),
])
def test_encoding_errors_name_the_state_and_field(row: tuple, message: str) -> None:
    codec = RowCodec("totals", "a BIGINT NOT NULL, b INT, c DOUBLE")
    with pytest.raises(StateSchemaError, match="state 'totals': " + message):
        codec.encode(row)


def test_a_row_written_before_nullable_fields_were_appended_reads_them_as_null() -> None:
    old = RowCodec("profile", "name STRING, age INT, address STRUCT<street: STRING>")
    new = RowCodec("profile", "name STRING, age BIGINT, address STRUCT<street: STRING, zip: INT>, email STRING")
    assert new.decode(old.encode(("ann", 30, ("Main St",)))) == ("ann", 30, ("Main St", None), None)


def test_decoding_a_value_written_under_another_schema_fails_clearly() -> None:
    old = RowCodec("profile", "name STRING, age INT")
    new = RowCodec("profile", "name STRING, age INT, email STRING NOT NULL")
    with pytest.raises(StateSchemaError, match="state 'profile': stored value has 2 fields.*has 3"):
        new.decode(old.encode(("ann", 30)))
    retyped = RowCodec("profile", "name STRING, age STRING")
    with pytest.raises(StateSchemaError, match="stored field 'age' does not match string"):
        retyped.decode(old.encode(("ann", 30)))
    with pytest.raises(StateSchemaError, match="codec version"):
        old.decode(msgpack.packb(["ann", 30]))


def test_fixed_width_codec_round_trips_records_and_rejects_foreign_lengths() -> None:
    codec = FixedWidthCodec("agg", [("count", "i8"), ("sum", "f8")])
    records = np.array([(1, 0.5), (2, -1.25)], dtype=codec.dtype)
    encoded = codec.encode_many(records)
    assert [len(v) for v in encoded] == [16, 16]
    assert codec.decode_many(encoded).tolist() == [(1, 0.5), (2, -1.25)]
    with pytest.raises(StateSchemaError, match="state 'agg': a stored value has 8 bytes"):
        codec.decode_many([encoded[0], b"\x00" * 8])
