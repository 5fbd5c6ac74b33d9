"""The Arrow schema sparkpoint expects must be the one the running pyspark's batches
carry: PySpark 4.0 labels TIMESTAMP columns UTC and has no `timezone=` parameter (a
call with it failed every stateful epoch on 4.0), later 4.x label them with the
session time zone."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.pandas import types as pyspark_types
from pyspark.sql.types import LongType, StructField, StructType, TimestampType

from sparkpoint.runtime import arrow_schema as subject

SCHEMA = StructType([StructField("ts", TimestampType()), StructField("n", LongType())])


@pytest.fixture(autouse=True)
def _fresh_probe():
    subject._takes_time_zone.cache_clear()
    yield
    subject._takes_time_zone.cache_clear()


def test_on_pyspark_4_0_timestamps_are_utc_whatever_the_session_zone(monkeypatch):
    def to_arrow_schema_4_0(schema, error_on_duplicated_field_names_in_struct=False, timestamp_utc=True,
                            prefers_large_types=False):
        return pa.schema([("ts", pa.timestamp("us", tz="UTC" if timestamp_utc else None)), ("n", pa.int64())])

    monkeypatch.setattr(pyspark_types, "to_arrow_schema", to_arrow_schema_4_0)
    assert subject.arrow_schema(SCHEMA, "Europe/Berlin").field("ts").type == pa.timestamp("us", tz="UTC")


def test_a_pyspark_that_takes_the_zone_labels_timestamps_with_it():
    if not subject._takes_time_zone():
        pytest.skip("this pyspark labels every timestamp UTC (covered above)")
    assert subject.arrow_schema(SCHEMA, "Europe/Berlin").field("ts").type == pa.timestamp("us", tz="Europe/Berlin")
