"""Recovering q12's processing times from a run's result (tests/nexmark/processing_time.py):
a result every bid of which counts once, whole files per window and windows in file
order, gives each file its window; a lost, duplicated or misplaced bid is refused, so
the q12 example test and the kill -9 script can fail."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.nexmark.processing_time import InconsistentResult, processing_times, window_of_each_file

T0 = pd.Timestamp("2023-11-14 22:13:20", tz="UTC")
W = pd.Timedelta(seconds=10)
# Three files of bids, by bidder: [1, 1, 2], [2], [1, 3].
BIDDERS = pd.Series([1, 1, 2, 2, 1, 3])
FILE_ROWS = [3, 1, 2]


def result(*rows: tuple[int, int, int]) -> pd.DataFrame:
    """(bidder, bid_count, window index) rows as q12's result."""
    return pd.DataFrame({"bidder": [r[0] for r in rows], "bid_count": [r[1] for r in rows],
                         "starttime": [T0 + r[2] * W for r in rows], "endtime": [T0 + (r[2] + 1) * W for r in rows]})


def test_each_file_gets_the_window_its_bids_were_counted_in():
    # files 0 and 1 in window 0, file 2 in window 3
    got = window_of_each_file(BIDDERS, FILE_ROWS, result((1, 2, 0), (2, 2, 0), (1, 1, 3), (3, 1, 3)))
    assert got == [T0, T0, T0 + 3 * W]
    times = processing_times(BIDDERS, FILE_ROWS, result((1, 2, 0), (2, 2, 0), (1, 1, 3), (3, 1, 3)))
    assert times.tolist() == [T0] * 4 + [T0 + 3 * W] * 2


def test_all_bids_in_one_window_is_consistent():
    assert window_of_each_file(BIDDERS, FILE_ROWS, result((1, 3, 2), (2, 2, 2), (3, 1, 2))) == [T0 + 2 * W] * 3


@pytest.mark.parametrize("rows, why", [
    (((1, 2, 0), (2, 1, 0), (1, 1, 3), (3, 1, 3)), "not all in window"),        # file 1's bid lost
    (((1, 2, 0), (2, 3, 0), (1, 1, 3), (3, 1, 3)), "that no file holds"),       # a bid counted twice
    (((1, 1, 0), (2, 1, 0), (1, 1, 1), (2, 1, 1), (1, 1, 3), (3, 1, 3)),
     "not all in window"),                                                       # file 0 split over two windows
    (((1, 2, 0), (2, 2, 0), (1, 1, 3), (3, 1, 3), (1, 0, 3)), "more than once"),
])
def test_a_result_no_processing_times_could_give_is_refused(rows, why):
    with pytest.raises(InconsistentResult, match=why):
        window_of_each_file(BIDDERS, FILE_ROWS, result(*rows))


def test_a_window_not_aligned_to_10_s_is_refused():
    shifted = result((1, 3, 0), (2, 2, 0), (3, 1, 0)).assign(starttime=lambda r: r.starttime + pd.Timedelta("1 ms"))
    with pytest.raises(InconsistentResult, match="aligned"):
        window_of_each_file(BIDDERS, FILE_ROWS, shifted)
