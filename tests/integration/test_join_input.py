"""A join's input as Spark builds it (`prepare_input`) is the input the operator and the
test harness take: same Arrow schema as `tag_rows`, and the rows join as expected."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from sparkpoint import IntervalJoin, WindowJoin
from sparkpoint.testing.harness import ProcessorTester

UTC = dt.timezone.utc


def _at(seconds: int) -> dt.datetime:
    return dt.datetime(2026, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=seconds)


def _plain(schema: pa.Schema) -> list[tuple[str, str]]:
    """Names and types, nullability left out (Spark marks columns nullable its own way)."""
    def strip(t: pa.DataType) -> str:
        if pa.types.is_struct(t):
            return "struct<" + ", ".join(f"{f.name}: {strip(f.type)}" for f in t) + ">"
        return str(t)
    return [(f.name, strip(f.type)) for f in schema]


def test_prepare_input_round_trips_to_the_operators_input_schema(spark) -> None:
    orders = spark.createDataFrame([(1, "o1", _at(0)), (2, "o2", _at(10)), (None, "o3", _at(0))],
                                   "id BIGINT, note STRING, ts TIMESTAMP")
    # The right key is an INT under another name: Spark's union widens it to BIGINT.
    payments = spark.createDataFrame([(1, 9.5, _at(30)), (2, 1.0, _at(1000)), (1, 2.0, _at(-1))],
                                     "order_id INT, amount DOUBLE, ts TIMESTAMP")
    op = IntervalJoin("orders-payments", "id", "order_id", "ts", "ts", 0, "15 min", how="left")
    tagged = op.prepare_input(orders, payments).toArrow()
    assert _plain(tagged.schema) == _plain(op.tag_rows(orders.toArrow(), payments.toArrow()).schema)

    op.resolve_input_schema(tagged.schema)  # what the driver does with the step's input
    assert op.output_schema.names == ["id", "note", "ts", "order_id", "amount", "ts_right"]
    assert op.output_schema.field("ts").type == pa.timestamp("us", tz="UTC")
    tester = ProcessorTester(op)
    first = tester.process(tagged)
    rest = tester.finish()
    # o1 meets its payment 30 s later (not the one a second before it); o3's null key meets
    # nothing, so it is out at once; o2's payment came too late, it waits for the end.
    assert first[["note", "amount"]].fillna(-1).values.tolist() == [["o3", -1], ["o1", 9.5]]
    assert rest["note"].tolist() == ["o2"] and rest["amount"].isna().all()


def test_a_window_join_reads_the_same_tagged_input(spark) -> None:
    clicks = spark.createDataFrame([(1, "a", 5), (1, "b", 15)], "user BIGINT, page STRING, ts BIGINT")
    views = spark.createDataFrame([(1, "x", 7), (1, "y", 9), (2, "z", 5)], "user BIGINT, ad STRING, t BIGINT")
    op = WindowJoin("clicks-views", "user", "user", "ts", "t", 10)
    tagged = op.prepare_input(clicks, views).toArrow()
    op.resolve_input_schema(tagged.schema)
    tester = ProcessorTester(op)
    tester.process(tagged)
    out = tester.finish()
    assert sorted(out[["page", "ad", "window_start", "window_end"]].values.tolist()) == \
        [["a", "x", 0, 10], ["a", "y", 0, 10]]


def test_prepare_input_refuses_a_missing_key_or_a_bad_time_column_in_one_line(spark) -> None:
    import pytest

    from sparkpoint.errors import ConfigError

    left = spark.createDataFrame([(1, "2026-01-01")], "id BIGINT, ts STRING")
    right = spark.createDataFrame([(1, 5)], "rid BIGINT, ts BIGINT")
    with pytest.raises(ConfigError, match=r"IntervalJoin 'j': right key column\(s\) \['id'\] are not in the right "
                                          r"input \(its columns: \['rid', 'ts'\]\)"):
        IntervalJoin("j", "id", "id", "ts", "ts", 0, 1).prepare_input(left, right)
    with pytest.raises(ConfigError, match=r"IntervalJoin 'j' left time: event-time column 'ts' is string"):
        IntervalJoin("j", "id", "rid", "ts", "ts", 0, 1).prepare_input(left, right)
