"""Processor state of every type Spark DDL declares (DECIMAL, DATE, TIMESTAMP,
TIMESTAMP_NTZ, ARRAY, MAP, STRUCT) in value, list and map state, run by the
ProcessorTester: exact values back from get(), across a snapshot and a restore, and as
the state reader reads them."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Iterator

import pandas as pd
import pyarrow as pa

from sparkpoint import ProcessorOperator, StatefulProcessor
from sparkpoint.api.state_schema import describe
from sparkpoint.testing import ProcessorTester

UTC = dt.timezone.utc
TOTALS = "total DECIMAL(12, 2) NOT NULL, first_day DATE, last_at TIMESTAMP, last_local TIMESTAMP_NTZ"
LINE = "sku STRING, price DECIMAL(8, 2), tags ARRAY<STRING>, attrs MAP<STRING, INT>"
DAY = "amount DECIMAL(12, 2), skus ARRAY<STRING>, last STRUCT<sku: STRING, at: TIMESTAMP>"


class Orders(StatefulProcessor):
    """Per customer: a running total (value), every order line (list) and, per day, the
    amount and skus bought (map keyed by DATE)."""

    def init(self, handle) -> None:
        self.totals = handle.getValueState("totals", TOTALS)
        self.lines = handle.getListState("lines", LINE)
        self.days = handle.getMapState("days", "day DATE", DAY)

    def handle_input_rows(self, key, rows: pd.DataFrame, timer_values) -> Iterator[pd.DataFrame]:
        old = self.totals.get()
        total = old[0] if old else Decimal(0)
        first_day = old[1] if old else None
        for r in rows.itertuples(index=False):
            total += r.price
            first_day = r.day if first_day is None else min(first_day, r.day)
            self.lines.appendValue((r.sku, r.price, list(r.tags), {t: len(t) for t in r.tags}))
            day = self.days.getValue(r.day)
            amount, skus = (day[0], day[1]) if day else (Decimal(0), [])
            self.days.updateValue(r.day, (amount + r.price, skus + [r.sku], (r.sku, r.at)))
        last = rows.iloc[-1]
        self.totals.update((total, first_day, last["at"], last["at"].tz_convert(None)))
        yield pd.DataFrame({"customer": [key[0]], "total": [str(total)]})


def orders() -> ProcessorOperator:
    return ProcessorOperator("orders", Orders, ["customer"], "customer BIGINT, total STRING")


def at(hour: int, day: int = 1) -> pd.Timestamp:
    return pd.Timestamp(2026, 3, day, hour, tz="UTC")


def epoch(*rows: tuple) -> pa.Table:
    return pa.table({
        "customer": pa.array([r[0] for r in rows], pa.int64()),
        "sku": pa.array([r[1] for r in rows]),
        "price": pa.array([Decimal(r[2]) for r in rows], pa.decimal128(8, 2)),
        "tags": pa.array([r[3] for r in rows], pa.list_(pa.string())),
        "day": pa.array([r[4].date() for r in rows], pa.date32()),
        "at": pa.array([r[4] for r in rows], pa.timestamp("us", tz="UTC")),
    })


FIRST = epoch((1, "apple", "0.10", ["fruit"], at(9)), (1, "pear", "19.99", [], at(10)),
              (2, "plum", "5.05", ["fruit", "red"], at(11, 2)))
SECOND = epoch((1, "fig", "100.01", ["dry"], at(8, 2)), (2, "kiwi", "0.01", ["green"], at(12, 2)))


def test_value_list_and_map_state_hold_decimal_dates_timestamps_and_nested_values_exactly() -> None:
    tester = ProcessorTester(orders())
    tester.process(FIRST)
    restored = ProcessorTester.from_snapshot(orders(), tester.snapshot())
    out = restored.process(SECOND)

    assert sorted(map(tuple, out.values.tolist())) == [(1, "120.10"), (2, "5.06")]
    assert restored.peek_value_state("totals", 1) == (Decimal("120.10"), dt.date(2026, 3, 1),
                                                      dt.datetime(2026, 3, 2, 8, tzinfo=UTC),
                                                      dt.datetime(2026, 3, 2, 8))
    assert restored.peek_list_state("lines", 1) == [
        ("apple", Decimal("0.10"), ["fruit"], {"fruit": 5}),
        ("pear", Decimal("19.99"), [], {}),
        ("fig", Decimal("100.01"), ["dry"], {"dry": 3}),
    ]
    assert restored.peek_map_state("days", 2) == {
        (dt.date(2026, 3, 2),): (Decimal("5.06"), ["plum", "kiwi"], ("kiwi", dt.datetime(2026, 3, 2, 12, tzinfo=UTC))),
    }
    assert restored.peek_map_state("days", 1)[(dt.date(2026, 3, 1),)][:2] == (Decimal("20.09"), ["apple", "pear"])


def test_the_state_reader_reads_nested_state_with_its_declared_types() -> None:
    tester = ProcessorTester(orders())
    tester.process(FIRST)
    assert describe(tester.step).output_schema().field("totals").type == pa.struct([
        pa.field("total", pa.decimal128(12, 2), nullable=False), pa.field("first_day", pa.date32()),
        pa.field("last_at", pa.timestamp("us", tz="UTC")), pa.field("last_local", pa.timestamp("us"))])
    rows = {r["customer"]: r for r in tester.state().to_dict("records")}
    assert rows[2]["totals"]["total"] == Decimal("5.05")
    [line] = rows[2]["lines"]
    assert (line["sku"], line["price"], list(line["tags"]), line["attrs"]) == \
        ("plum", Decimal("5.05"), ["fruit", "red"], [("fruit", 5), ("red", 3)])
    [(day, held)] = rows[1]["days"]
    assert (day, held["amount"], list(held["skus"]), held["last"]) == \
        (dt.date(2026, 3, 1), Decimal("20.09"), ["apple", "pear"],
         {"sku": "pear", "at": pd.Timestamp(2026, 3, 1, 10, tz="UTC")})
