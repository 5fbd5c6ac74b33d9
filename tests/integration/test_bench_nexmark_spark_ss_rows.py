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
# 3 000 events at 40 per second: 75 s of event time in 2 files per stream, one file per epoch or
# batch; the files meet in the middle of a window, so windows close and join pairs meet across
# batches.
EVENTS, RATE, FILES = 3_000, 40, 2
BASE = pd.Timestamp(NexmarkConfig().base_time_ms, unit="ms", tz="UTC")  # event 0's time, a window start
HIGH = 10**12  # above every generated price (at most 10^8 cents)
SENTINEL_ID = {"person": ("id", -1), "auction": ("seller", -1), "bid": ("auction", -3)}
# The column of each query's output that carries the sentinel's id.
SENTINEL_COLUMN = {"q5": ("auction", -3), "q7": ("auction", -3), "q8": ("id", -1)}
READS = {"q5": ["bid"], "q7": ["bid"], "q8": ["person", "auction"]}


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


def _with_bids_at_window_ends(directory: Path) -> None:
    """Add bids at 10 s window boundaries, which the generated events never have (at their rate
    a person falls on every boundary), each file keeping its own span of time:
    - [20 s, 30 s)'s highest is bid -10's; bid -11 at 30 s has that price: it matches that
      window's maximum at its end, and is in [30 s, 40 s);
    - bid -12 at 30 s, higher, is [30 s, 40 s)'s highest and does not count towards the earlier
      window's maximum at whose end it is;
    - bid -13 at 40 s has bid -12's price and is the highest of [40 s, 50 s): it matches two
      windows and comes out twice."""
    at = {-10: (HIGH, 22_000), -11: (HIGH, 30_000), -12: (HIGH + 1, 30_000), -13: (HIGH + 1, 40_000)}
    files = sorted((directory / "bid").glob("*.parquet"))
    tables = [pq.read_table(f) for f in files]
    added = pa.Table.from_pylist([{"auction": a, "bidder": 7, "price": price, "channel": "c", "url": "u",
                                   "dateTime": BASE + pd.Timedelta(milliseconds=ms), "extra": f"bid {a}"}
                                  for a, (price, ms) in at.items()], schema=SCHEMAS["bid"])
    for f, table in zip(files, tables):
        span = pc.max(table.column("dateTime"))
        mine = added.filter(pc.less_equal(added.column("dateTime"), span))
        added = added.filter(pc.greater(added.column("dateTime"), span))
        merged = pa.concat_tables([table, mine]).sort_by([("dateTime", "ascending")])
        pq.write_table(merged, f)
    assert added.num_rows == 0


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("nexmark-peers")
    write_parquet(str(directory), EVENTS, NexmarkConfig(seed=0, rate=RATE), files_per_stream=FILES)
    _with_bids_at_window_ends(directory)
    _end_with_sentinels(directory)
    return directory


def _spark_ss_rows(spark, spark_ss, query: str, input_dir: Path, work: Path) -> pd.DataFrame:
    spark_ss.configure(spark)
    rss = spark_ss.PeakRss()
    try:
        measured = spark_ss.run_query(spark, query, str(input_dir), str(work), 1, rss, timeout_s=300,
                                      output_dir=str(work / "out"))
    finally:
        rss.stop()
    # Events/s counts each event once, also where the query reads a stream twice (q7).
    read = sum(pq.ParquetFile(f).metadata.num_rows for s in READS[query] for f in (input_dir / s).glob("*.parquet"))
    assert measured["events"] == read, f"{query}: {measured['events']} events measured, the input has {read}"
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
    theirs = _compare(spark, spark_ss, query, generated, tmp_path, monkeypatch)
    if query == "q7":  # nexmark's BETWEEN includes the window's end (_with_bids_at_window_ends)
        assert sorted(theirs.auction[theirs.auction <= -10]) == [-13, -13, -12, -11, -10]
