"""State schemas in DDL mean the same with and without Spark: with a session running,
Spark's own parser reads them; without one (a Python worker, the ProcessorTester),
sparkpoint's. The two agree on the same strings, accepted and refused."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkpoint.errors import StateSchemaError
from sparkpoint.state.codec import parse_schema, parse_with_spark
from sparkpoint.state.ddl import parse_ddl
from tests.unit.state.test_state_ddl import AGREED_DDL, REFUSED_DDL

pytestmark = pytest.mark.spark


def test_spark_and_the_python_parser_give_the_same_arrow_schema(spark) -> None:
    for ddl in AGREED_DDL:
        assert parse_with_spark(ddl, "s") == pa.schema(parse_ddl(ddl, "s")), ddl


def test_spark_and_the_python_parser_refuse_the_same_strings(spark) -> None:
    for ddl in REFUSED_DDL:
        with pytest.raises(StateSchemaError):
            parse_with_spark(ddl, "s")
        with pytest.raises(StateSchemaError):
            parse_ddl(ddl, "s")


def test_a_refused_schema_gets_the_same_line_with_a_session_running_as_without_one(spark) -> None:
    for ddl in REFUSED_DDL:
        with pytest.raises(StateSchemaError) as python:
            parse_ddl(ddl, "state 's'")
        with pytest.raises(StateSchemaError) as with_spark:
            parse_with_spark(ddl, "state 's'")
        assert str(with_spark.value) == str(python.value), ddl


def test_with_a_session_running_a_declared_schema_is_parsed_by_spark(spark, monkeypatch) -> None:
    import sparkpoint.state.codec as codec

    asked = []
    monkeypatch.setattr(codec, "parse_with_spark", lambda ddl, what: asked.append(ddl) or pa.schema([]))
    codec._parse_ddl_string.cache_clear()
    try:
        parse_schema("only_via_spark DECIMAL(3, 1)")
    finally:
        codec._parse_ddl_string.cache_clear()
    assert asked == ["only_via_spark DECIMAL(3, 1)"]
