"""q12's processing-time windows on a manual clock, where the example test can only take
the times its run happened to have: an epoch's bids count in the window of the epoch's
processing time, a window is emitted once, when the processing time reaches its end,
and the end of input emits the windows still open."""

from __future__ import annotations

import runpy
from pathlib import Path

import pandas as pd
import pytest

from sparkpoint import ProcessorOperator
from sparkpoint.testing.harness import ProcessorTester

Q12 = Path(__file__).resolve().parents[2] / "examples" / "nexmark" / "q12.py"
START = 1_700_000_000_000  # a window start (a multiple of 10 s)


@pytest.fixture(scope="module")
def q12():
    return runpy.run_path(str(Q12))


def at(ms: int) -> pd.Timestamp:
    return pd.Timestamp(ms, unit="ms", tz="UTC")


def rows(frame: pd.DataFrame) -> list[tuple]:
    return sorted((int(r.bidder), int(r.bid_count), r.starttime, r.endtime) for r in frame.itertuples())


def test_bids_count_in_the_window_of_their_epochs_processing_time_emitted_once_when_it_ends(q12):
    step = ProcessorOperator("bids-per-processing-window", q12["BidsPerProcessingWindow"], ["bidder"], q12["COUNTS"],
                             time_mode="processingtime")
    tester = ProcessorTester(step, processing_time_ms=START + 2_000)
    # Each epoch's bids arrive counted per bidder, as Spark counts them before the step.
    assert tester.process(pd.DataFrame({"bidder": [1, 2], "bids": [3, 1]})).empty
    assert tester.set_processing_time(START + 9_999).empty
    assert tester.process(pd.DataFrame({"bidder": [1], "bids": [2]})).empty, "the window has not ended"
    fired = tester.set_processing_time(START + 10_000)  # an epoch without bids, at the window's end
    assert list(fired.columns) == ["bidder", "bid_count", "starttime", "endtime"]
    assert rows(fired) == [(1, 5, at(START), at(START + 10_000)), (2, 1, at(START), at(START + 10_000))]
    assert tester.process(pd.DataFrame({"bidder": [1], "bids": [4]})).empty  # the next window's first instant
    assert tester.set_processing_time(START + 19_999).empty
    assert tester.process(pd.DataFrame({"bidder": [2], "bids": [7]})).empty
    assert rows(tester.set_processing_time(START + 45_000)) == [(1, 4, at(START + 10_000), at(START + 20_000)),
                                                                (2, 7, at(START + 10_000), at(START + 20_000))]
    assert tester.process(pd.DataFrame({"bidder": [3], "bids": [1]})).empty
    assert rows(tester.finish()) == [(3, 1, at(START + 40_000), at(START + 50_000))], "the end of input fires it"
