"""q6's average per seller on its own: auctions closed in one epoch arrive in any order
and are taken in the order they closed (expires, then id), and the frame keeps the last
10 winning prices across epochs. The example test checks the whole query on the shared
events; this pins the order within an epoch, which those events may not exercise for
every seller."""

from __future__ import annotations

import runpy
from pathlib import Path

import pandas as pd
import pytest

from sparkpoint import ProcessorOperator
from sparkpoint.testing.harness import ProcessorTester

Q6 = Path(__file__).resolve().parents[2] / "examples" / "nexmark" / "q6.py"
T0 = pd.Timestamp("2023-11-14 22:13:20", tz="UTC")


@pytest.fixture(scope="module")
def q6():
    return runpy.run_path(str(Q6))


def closed(*auctions: tuple[int, int, float]) -> pd.DataFrame:
    """(id, final, expires in seconds) of seller 7's auctions, as the winning-price step emits them."""
    return pd.DataFrame({"seller": [7] * len(auctions), "final": [a[1] for a in auctions],
                         "expires": [T0 + pd.Timedelta(seconds=a[2]) for a in auctions],
                         "id": [a[0] for a in auctions]})


def test_each_closed_auction_gives_the_average_of_the_last_10_in_closing_order(q6):
    tester = ProcessorTester(ProcessorOperator("average-price", q6["AveragePrice"], ["seller"], q6["AVERAGE"]))
    # closing order: id 2 (1 s), id 1 (2 s), id 3 before id 4 (both 3 s)
    first = tester.process(closed((1, 20, 2), (4, 100, 3), (2, 10, 1), (3, 40, 3)))
    assert first.avg_price.tolist() == [10, 15, 23, 42]  # 10 | 10, 20 | 10, 20, 40 | 10, 20, 40, 100
    later = tester.process(closed(*[(10 + i, 1, 10 + i) for i in range(7)]))
    # the 11th auction pushes out the first (10): 20 + 100 + 40 + 7 * 1 = 167 over 10
    assert later.avg_price.tolist()[-1] == 167 // 10 and len(later) == 7
    assert set(later.seller) == {7}
