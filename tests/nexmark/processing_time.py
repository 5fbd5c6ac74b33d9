"""The processing times a run of q12 gave its bids, recovered from its result, so that
the pandas reference can compute q12 for that run (`reference.q12`).

Processing time is not reproducible: each run has its own. What a correct run must
satisfy is narrower than a fixed answer, and this module checks it. sparkpoint gives all
rows of an epoch one processing time, and a file source reads each file whole in one
epoch, files in name order, epochs in increasing processing time. So all bids of a file
fall in one 10 s window per bidder, the same window for every bidder, and the windows do
not go back from one file to the next. Walking the files in order and taking each
file's bids out of the earliest window of the result that still has bids left assigns
every file its window; the run is consistent with the query if every file fits whole
and nothing is left over. A lost, duplicated or misplaced bid leaves a file that does
not fit or a window with bids no file holds, and the error names it.
"""

from __future__ import annotations

import glob
import os
from collections import Counter

import pandas as pd
import pyarrow.parquet as pq

WINDOW = pd.Timedelta(seconds=10)


class InconsistentResult(AssertionError):
    """The result is not q12 of any sequence of processing times of the files."""


def rows_per_file(directory: str) -> list[int]:
    """The row count of each Parquet file in `directory`, files in name order."""
    return [pq.ParquetFile(f).metadata.num_rows for f in sorted(glob.glob(os.path.join(directory, "*.parquet")))]


def window_of_each_file(bidders: pd.Series, file_rows: list[int], result: pd.DataFrame) -> list[pd.Timestamp]:
    """The start of the window each file's bids were counted in. `bidders`: the bidder of
    each bid, in stream order; `file_rows`: how many bids each file holds, files in order;
    `result`: q12's rows (bidder, bid_count, starttime, endtime). InconsistentResult if
    the result is not q12 of any processing times the files could have been read at."""
    if sum(file_rows) != len(bidders):
        raise ValueError(f"the files hold {sum(file_rows)} bids, the stream {len(bidders)}")
    start, end = pd.to_datetime(result.starttime, utc=True), pd.to_datetime(result.endtime, utc=True)
    if len(result) == 0:
        if len(bidders):
            raise InconsistentResult(f"no windows for {len(bidders)} bids")
        return [pd.Timestamp(0, tz="UTC")] * len(file_rows)
    misaligned = result[(start != start.dt.floor(WINDOW)) | (end - start != WINDOW)]
    if len(misaligned):
        raise InconsistentResult(f"windows not 10 s long and 10 s aligned:\n{misaligned.head()}")
    twice = result[pd.DataFrame({"b": result.bidder, "s": start}).duplicated(keep=False)]
    if len(twice):
        raise InconsistentResult(f"a bidder's window emitted more than once:\n{twice.head()}")
    windows = [(t, Counter(dict(zip(rows.bidder.tolist(), rows.bid_count.tolist()))))
               for t, rows in result.assign(starttime=start).groupby("starttime", sort=True)]
    assigned, w, offset = [], 0, 0
    for f, n in enumerate(file_rows):
        counts = Counter(bidders.iloc[offset:offset + n].tolist())
        offset += n
        while w < len(windows) and not +windows[w][1]:
            w += 1
        if not counts:  # an empty file: its (no) bids are anywhere
            assigned.append(windows[min(w, len(windows) - 1)][0])
            continue
        if w == len(windows):
            raise InconsistentResult(f"file {f}'s {n} bids are in no window: every window is full")
        left = windows[w][1]
        missing = counts - left
        if missing and assigned and assigned[-1] == windows[w][0]:
            raise InconsistentResult(f"window {windows[w][0]} counts bids that no file holds: after file {f - 1}, "
                                     f"the last that fits it, e.g. (bidder, bids) {list((+left).items())[:3]} are "
                                     f"left over, and file {f} does not fit")
        if missing:
            raise InconsistentResult(f"file {f}'s bids are not all in window {windows[w][0]}, the earliest with "
                                     f"bids left: e.g. (bidder, bids short) {list(missing.items())[:3]}")
        left.subtract(counts)
        assigned.append(windows[w][0])
    extra = [(t, bidder, n) for t, left in windows for bidder, n in left.items() if n]
    if extra:
        raise InconsistentResult(f"{sum(n for *_, n in extra)} bids counted that no file holds: e.g. (window, "
                                 f"bidder, bids) {extra[:3]}")
    return assigned


def processing_times(bidders: pd.Series, file_rows: list[int], result: pd.DataFrame) -> pd.Series:
    """PROCTIME() of each bid as the run gave it, to the window: its file's window start."""
    starts = window_of_each_file(bidders, file_rows, result)
    return pd.Series([t for t, n in zip(starts, file_rows) for _ in range(n)], index=bidders.index,
                     dtype="datetime64[ns, UTC]")
