from __future__ import annotations

import datetime as dt

import msgpack
import numpy as np
import pyarrow as pa
import pytest

from sparkpoint.errors import StateSchemaError
from sparkpoint.state.codec import FixedWidthCodec, RowCodec, parse_schema

UTC = dt.timezone.utc
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
    ("count BIGINT, total MONEY", "field 'total' has type MONEY"),
    ("m MAP<STRING, INT>", "nested"),
    ("just_a_name", "cannot parse field 'just_a_name'"),
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


def test_decoding_a_value_written_under_another_schema_fails_clearly() -> None:
    old = RowCodec("profile", "name STRING, age INT")
    new = RowCodec("profile", "name STRING, age INT, email STRING")
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
