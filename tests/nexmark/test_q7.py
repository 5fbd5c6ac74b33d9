"""q7's bids at a window's first instant, which the shared events do not have (at their
rate every 10 s boundary falls on a person): such a bid is placed in its own window and
at the end of the previous one, and matches the previous window's highest price (SQL's
BETWEEN includes both ends) without counting towards it."""

from __future__ import annotations

import runpy
from pathlib import Path

import pandas as pd
import pytest

from sparkpoint import ProcessorOperator
from sparkpoint.testing.harness import ProcessorTester

Q7 = Path(__file__).resolve().parents[2] / "examples" / "nexmark" / "q7.py"
START = 1_700_000_000_000  # a window start (a multiple of 10 s)


@pytest.fixture(scope="module")
def q7():
    return runpy.run_path(str(Q7))


def bid(auction: int, price: int, ms: int) -> dict:
    return {"auction": auction, "bidder": 7, "price": price, "dateTime": pd.Timestamp(ms, unit="ms", tz="UTC"),
            "extra": f"bid {auction}"}


def placed(b: dict, window: int, at_end: bool) -> dict:
    return {**b, "window": window, "at_end": at_end}


@pytest.mark.spark
def test_a_bid_at_a_window_boundary_is_in_its_window_and_at_the_end_of_the_previous_one(spark, q7):
    bids = [bid(1, 5, START + 9_999), bid(2, 5, START + 10_000), bid(3, 5, START + 10_001)]
    frame = spark.createDataFrame(pd.DataFrame(bids), schema=q7["BID"])
    got = sorted(q7["by_window"](frame).select("auction", "window", "at_end").collect())
    assert [tuple(r) for r in got] == [(1, START, False), (2, START, True), (2, START + 10_000, False),
                                       (3, START + 10_000, False)]


def test_a_window_emits_its_highest_bids_and_those_at_its_end_with_that_price_when_the_watermark_reaches_its_end(q7):
    step = ProcessorOperator("highest-bids", q7["HighestBids"], ["window"], q7["BID"], time_mode="eventtime")
    tester = ProcessorTester(step)
    end = START + 10_000
    first = [placed(bid(1, 40, START + 1_000), START, False), placed(bid(2, 90, START + 2_000), START, False)]
    later = [placed(bid(3, 90, START + 9_000), START, False), placed(bid(4, 20, START + 9_500), START, False),
             # at the end instant: a candidate at 90, one not; neither counts towards the maximum
             placed(bid(5, 90, end), START, True), placed(bid(6, 500, end), START, True),
             placed(bid(5, 90, end), end, False), placed(bid(6, 500, end), end, False)]
    assert tester.process(pd.DataFrame(first)).empty
    assert tester.process(pd.DataFrame(later)).empty
    assert tester.advance_watermark(end - 1).empty, "a bid at the end instant may still come"
    fired = tester.advance_watermark(end)
    assert sorted(fired["auction"]) == [2, 3, 5] and set(fired["price"]) == {90}
    assert list(fired.columns) == ["auction", "bidder", "price", "dateTime", "extra"]
    assert tester.peek_value_state("highest", START) is None, "the window's state is cleared once it fired"
    last = tester.finish()
    assert sorted(zip(last["auction"], last["price"])) == [(6, 500)], "the next window's own highest bid"
