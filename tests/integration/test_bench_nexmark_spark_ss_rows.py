"""Spark Structured Streaming's forms of the windowed Nexmark queries (bench/nexmark_spark_ss.py)
emit the rows sparkpoint's examples (examples/nexmark/) emit for the same input, compared as
multisets of rows (tests/nexmark/rows.py): the benchmark compares like with like.

Spark SS has no end-of-input watermark: the windows its last watermark leaves open never fire,
where sparkpoint fires them when its input ends. Each stream therefore ends with one sentinel
event a minute after its last one, in a file of its own: its watermark closes every window of the
input in both systems. The sentinel's own windows fire only in sparkpoint, so its rows (ids below
zero) are left out of sparkpoint's before the comparison, and must not be in Spark's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from sparkpoint.connectors.nexmark import SCHEMAS, STREAMS, NexmarkConfig, write_parquet
from tests.nexmark.rows import assert_same_rows
from tests.nexmark.test_examples import final_result, run_example

pytestmark = pytest.mark.spark

BENCH = Path(__file__).resolve().parents[2] / "bench"
# 4 000 events at 50 per second: 80 s of event time in 4 files per stream, one file per epoch or
# batch, so windows close and join pairs meet across batches.
EVENTS, RATE, FILES = 4_000, 50, 4
SENTINEL_ID = {"person": ("id", -1), "auction": ("seller", -1), "bid": ("auction", -3)}
# The column of each query's output that carries the sentinel's id.
SENTINEL_COLUMN = {"q5": ("auction", -3), "q7": ("auction", -3), "q8": ("id", -1)}


@pytest.fixture(scope="module")
def spark_ss():
    sys.path.insert(0, str(BENCH))
    try:
        import nexmark_spark_ss
    finally:
        sys.path.remove(str(BENCH))
    return nexmark_spark_ss


def _end_with_sentinels(directory: Path, streams=STREAMS) -> None:
    """Append to each stream a file with one event a minute after the input's last one: its
    person registers and opens its auction in the same window, no bid names the auction, and all
    ids are below zero. The files get increasing modification times: Spark's file source reads
    new files in modification-time order, sparkpoint's nexmark input in name order."""
    last = {s: pq.read_table(sorted((directory / s).glob("*.parquet"))[-1]) for s in streams}
    after = max(pc.max(t.column("dateTime")).as_py() for t in last.values()) + pd.Timedelta(minutes=1)
    for stream in streams:
        row = last[stream].slice(last[stream].num_rows - 1)
        changes = {"dateTime": after, **dict([SENTINEL_ID[stream]])}
        if stream == "auction":
            changes["id"] = -2
        for column, value in changes.items():
            i = row.schema.get_field_index(column)
            row = row.set_column(i, column, pa.array([value], row.schema.field(i).type))
        pq.write_table(row, directory / stream / "part-99999.parquet")
        for i, path in enumerate(sorted((directory / stream).glob("*.parquet"))):
            os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("nexmark-peers")
    write_parquet(str(directory), EVENTS, NexmarkConfig(seed=0, rate=RATE), files_per_stream=FILES)
    _end_with_sentinels(directory)
    return directory


def _spark_ss_rows(spark, spark_ss, query: str, input_dir: Path, work: Path) -> pd.DataFrame:
    spark_ss.configure(spark)
    rss = spark_ss.PeakRss()
    try:
        spark_ss.run_query(spark, query, str(input_dir), str(work), 1, rss, timeout_s=300,
                           output_dir=str(work / "out"))
    finally:
        rss.stop()
    table = ds.dataset(str(work / "out"), format="parquet", partitioning="hive").to_table()
    return table.drop_columns(["batch"]).to_pandas()


def _sparkpoint_rows(spark, query: str, input_dir: Path, root: Path, monkeypatch) -> pd.DataFrame:
    monkeypatch.delenv("NEXMARK_SIDE_INPUT", raising=False)
    committed = run_example(spark, query, root, monkeypatch, NEXMARK_INPUT=str(input_dir),
                            NEXMARK_FILES_PER_EPOCH="1")
    return final_result(query, committed).to_pandas()


def _compare(spark, spark_ss, query: str, input_dir: Path, tmp_path: Path, monkeypatch) -> pd.DataFrame:
    ours = _sparkpoint_rows(spark, query, input_dir, tmp_path / "sparkpoint", monkeypatch)
    theirs = _spark_ss_rows(spark, spark_ss, query, input_dir, tmp_path / "spark-ss")
    column, sentinel = SENTINEL_COLUMN[query]
    assert (ours[column] == sentinel).any(), f"{query}: sparkpoint fired no sentinel window at the end of input"
    assert not (theirs[column] == sentinel).any(), f"{query}: Spark SS fired a window its watermark left open"
    ours = ours[ours[column] != sentinel].reset_index(drop=True)
    assert len(ours) > 0, f"{query}: no rows on the events, so the comparison would prove little"
    assert_same_rows(theirs, ours)
    return theirs


@pytest.mark.parametrize("query", ["q5", "q7", "q8"])
def test_spark_ss_emits_the_rows_of_sparkpoints_example(spark, spark_ss, generated, query, tmp_path, monkeypatch):
    _compare(spark, spark_ss, query, generated, tmp_path, monkeypatch)


def test_spark_ss_q7_matches_a_bid_at_a_window_end_with_the_earlier_windows_highest_price(
        spark, spark_ss, tmp_path_factory, tmp_path, monkeypatch):
    # The generated events put a person, never a bid, on a window boundary: these bids do.
    start = pd.Timestamp(1_700_000_000_000, unit="ms", tz="UTC")  # a window start (a multiple of 10 s)

    def bids(*rows) -> pa.Table:
        return pa.Table.from_pylist([{"auction": a, "bidder": 7, "price": p, "channel": "c", "url": "u",
                                      "dateTime": start + pd.Timedelta(milliseconds=ms), "extra": f"bid {a}"}
                                     for a, p, ms in rows], schema=SCHEMAS["bid"])

    directory = tmp_path_factory.mktemp("nexmark-q7-boundary")
    os.makedirs(directory / "bid")
    # [0 s, 10 s): highest 90, bid 1's. At 10 s, its end: bid 2 at 90 matches it, bid 3 at 500 is
    # the highest of [10 s, 20 s) and does not count towards the earlier window's maximum.
    # [20 s, 30 s) and [30 s, 40 s): bid 7 at 30 s is the highest of both, so it comes out twice.
    pq.write_table(bids((1, 90, 2_000), (4, 20, 9_999), (2, 90, 10_000), (3, 500, 10_000)),
                   directory / "bid" / "part-00000.parquet")
    pq.write_table(bids((5, 60, 15_000), (6, 70, 25_000), (7, 70, 30_000)), directory / "bid" / "part-00001.parquet")
    _end_with_sentinels(directory, streams=["bid"])
    theirs = _compare(spark, spark_ss, "q7", directory, tmp_path, monkeypatch)
    assert sorted(theirs.auction) == [1, 2, 3, 6, 7, 7]
