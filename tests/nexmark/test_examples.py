"""Every Nexmark example pipeline (examples/nexmark/qN.py), run in-process to the end of
its input, writes exactly the rows its pandas reference (tests/nexmark/reference.py)
computes from the same events: nexmark-flink's result for that query on bounded input.

One set of 20 000 events (seed 0, twenty Parquet files per stream) is generated per
module and read by every run through NEXMARK_INPUT, as a user would run an example. At 500
events per second of event time they span four 10-second windows. An epoch reads five files
of each stream, so a run has four epochs of input, 10 s of event time each, before the end
of input: join pairs meet across epochs, and windows and auction timers fire by the
watermark before the end of input fires the rest, also two stateful steps downstream
(each stateful hop runs one epoch behind in event time: runtime/graph.py)."""

from __future__ import annotations

import glob
import os
import re
import runpy
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from sparkpoint import Settings
from sparkpoint.connectors.base import SlicePlan, SourceContext
from sparkpoint.connectors.nexmark import STREAMS, NexmarkConfig, NexmarkGenerator, write_parquet
from sparkpoint.connectors.nexmark_io import nexmark_input, write_side_input
from sparkpoint.connectors.nexmark_source import NexmarkSource
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus
from tests.nexmark import processing_time, reference
from tests.nexmark.rows import assert_same_rows

pytestmark = pytest.mark.spark

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "nexmark"
EVENTS = 20_000
SEED = 0
RATE = 500
FILES = 20  # per stream; nexmark_input reads 10 per epoch
# The queries the pipeline API can express today, each with its reference; the others
# wait for windows and aggregates (docs/nexmark.md).
EXPRESSIBLE = ["q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q9", "q10", "q11", "q12", "q13", "q14", "q15",
               "q16", "q17", "q18", "q19", "q20", "q21"]

# Queries whose result updates as input comes (Flink's updating tables), with the key
# whose latest row is the result.
UPDATING = {"q4": ["id"], "q15": ["day"], "q16": ["channel", "day"], "q17": ["auction", "day"],
            "q18": ["bidder", "auction"], "q19": ["auction", "rank_number"]}
# Queries that emit a window's or an auction's result when the watermark passes its end:
# on the shared events some of it comes out before the end of input. q11's sessions do
# too, but on the shared events every bidder bids more often than every 10 s, so none
# ends before the input does: test_q11_emits_sessions_by_the_watermark_on_sparse_bids.
FIRED_BY_WATERMARK = {"q4", "q5", "q6", "q7", "q8", "q9"}
# Queries in processing time: their result belongs to the run. The reference is given the
# processing times the run's result shows (tests/nexmark/processing_time.py).
PROCESSING_TIME = {"q12"}


@pytest.fixture(scope="module")
def nexmark_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("nexmark")
    write_parquet(str(directory), EVENTS, NexmarkConfig(seed=SEED, rate=RATE), files_per_stream=FILES)
    write_side_input(str(directory / "side_input.csv"))
    return directory


@pytest.fixture(scope="module")
def events(nexmark_dir) -> reference.Events:
    return reference.load(str(nexmark_dir), side_input=str(nexmark_dir / "side_input.csv"))


# nexmark-flink's sink tables (CREATE TABLE nexmark_qN in qN.sql), column for column.
SINK_TABLES = {
    "q0": "auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3), extra VARCHAR",
    "q1": "auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), dateTime TIMESTAMP(3), extra VARCHAR",
    "q2": "auction BIGINT, price BIGINT",
    "q10": "auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3), extra VARCHAR, dt STRING, hm STRING",
    "q13": "auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3), value VARCHAR",
    "q14": "auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), bidTimeType VARCHAR, dateTime TIMESTAMP(3), "
           "extra VARCHAR, c_counts BIGINT",
    "q21": "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, channel_id VARCHAR",
    "q15": "day VARCHAR, " + ", ".join(f"{c} BIGINT" for of in ("bids", "bidders", "auctions")
                                       for c in (f"total_{of}", f"rank1_{of}", f"rank2_{of}", f"rank3_{of}")),
    "q16": "channel VARCHAR, day VARCHAR, minute VARCHAR, " + ", ".join(
        f"{c} BIGINT" for of in ("bids", "bidders", "auctions")
        for c in (f"total_{of}", f"rank1_{of}", f"rank2_{of}", f"rank3_{of}")),
    "q17": "auction BIGINT, day VARCHAR, total_bids BIGINT, rank1_bids BIGINT, rank2_bids BIGINT, rank3_bids BIGINT, "
           "min_price BIGINT, max_price BIGINT, avg_price BIGINT, sum_price BIGINT",
    "q18": "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, dateTime TIMESTAMP(3), "
           "extra VARCHAR",
    "q19": "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, dateTime TIMESTAMP(3), "
           "extra VARCHAR, rank_number BIGINT",
    "q5": "auction BIGINT, num BIGINT",
    "q6": "seller VARCHAR, avg_price BIGINT",
    "q11": "bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3)",
    "q12": "bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3)",
    # Those of the queries whose examples wait for stream joins and windows.
    "q3": "name VARCHAR, city VARCHAR, state VARCHAR, id BIGINT",
    "q4": "id BIGINT, final BIGINT",
    "q7": "auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3), extra VARCHAR",
    "q8": "id BIGINT, name VARCHAR, stime TIMESTAMP(3)",
    "q9": "id BIGINT, itemName VARCHAR, description VARCHAR, initialBid BIGINT, reserve BIGINT, "
          "dateTime TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra VARCHAR, "
          "auction BIGINT, bidder BIGINT, price BIGINT, bid_dateTime TIMESTAMP(3), bid_extra VARCHAR",
    "q20": "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, bid_dateTime TIMESTAMP(3), "
           "bid_extra VARCHAR, itemName VARCHAR, description VARCHAR, initialBid BIGINT, reserve BIGINT, "
           "auction_dateTime TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, "
           "auction_extra VARCHAR",
}
ARROW_TYPES = {"BIGINT": pa.int64(), "VARCHAR": pa.string(), "STRING": pa.string(),
               "DECIMAL(23, 3)": pa.decimal128(23, 3)}


def sink_columns(query: str) -> list[tuple[str, str]]:
    return re.findall(r"(\w+) (DECIMAL\(\d+, \d+\)|\w+(?:\(\d+\))?)", SINK_TABLES[query])


def assert_sink_schema(query: str, schema: pa.Schema) -> None:
    """Names and types of nexmark-flink's sink table; a TIMESTAMP(3) may come in any unit,
    in UTC (Spark writes microseconds)."""
    for field, (name, ddl) in zip(schema, sink_columns(query), strict=True):
        assert field.name == name, f"{query}: column {field.name!r} where the sink table has {name!r}"
        if ddl == "TIMESTAMP(3)":
            assert pa.types.is_timestamp(field.type) and field.type.tz == "UTC", f"{query}.{name}: {field.type}"
        else:
            assert field.type == ARROW_TYPES[ddl], f"{query}.{name}: {field.type}, expected {ddl}"


def _settings(root: Path, name: str) -> Settings:
    return Settings.load(overrides={
        "pipeline.name": name, "execution.checkpointing.dir": str(root / "checkpoints"),
        "state.local.dir": str(root / "state"), "execution.checkpointing.interval": "1 s",
        "sparkpoint.progress": False, "rest.enabled": False, "restart-strategy.type": "none"})


def run_example(spark, query: str, root: Path, monkeypatch, **env: str) -> pa.Table:
    """Load examples/nexmark/<query>.py as `sparkpoint run` does, with `env` set, run it to
    the end of its input and return its committed output (with each row's `epoch`)."""
    out = root / "out"
    monkeypatch.setenv("NEXMARK_OUTPUT", str(out))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    pipeline = runpy.run_path(str(EXAMPLES / f"{query}.py"))["pipeline"]
    result = JobMaster(pipeline, _settings(root, f"nexmark-{query}"), spark=spark).run()
    assert result.status == JobStatus.FINISHED
    table = ds.dataset(str(out), format="parquet", partitioning="hive", ignore_prefixes=["_", "."]).to_table()
    return table


def final_result(query: str, committed: pa.Table) -> pa.Table:
    """The query's result from its committed rows. An updating query's rows are a
    changelog: each epoch writes the new value of every key that changed, once, and the
    latest row of a key is its value, as an upsert sink keeps it. The other queries
    append: every committed row is a result row."""
    key = UPDATING.get(query)
    if key is None:
        return committed.drop_columns(["epoch"])
    changes = committed.to_pandas()
    twice = changes[changes.duplicated(["epoch", *key], keep=False)]
    assert twice.empty, f"{query}: a key written twice in one epoch:\n{twice}"
    latest = changes.sort_values("epoch", kind="stable").drop_duplicates(key, keep="last")
    return pa.Table.from_pandas(latest.drop(columns=["epoch"]), schema=committed.schema.remove(
        committed.schema.get_field_index("epoch")), preserve_index=False)


def test_every_example_is_checked_against_its_reference():
    examples = sorted(Path(p).stem for p in glob.glob(str(EXAMPLES / "q*.py")))
    assert examples == sorted(EXPRESSIBLE)
    assert set(EXPRESSIBLE) <= set(reference.QUERIES) == set(SINK_TABLES)


def read_at(events: reference.Events, nexmark_dir: Path, result: pd.DataFrame) -> reference.Events:
    """`events` with each bid's processing time as the run whose `result` is given used it."""
    bidders, files = events.bid.bidder, processing_time.rows_per_file(str(nexmark_dir / "bid"))
    return reference.Events(events.person, events.auction,
                            events.bid.assign(p_time=processing_time.processing_times(bidders, files, result)),
                            events.side_input)


@pytest.mark.parametrize("query", sorted(reference.QUERIES, key=lambda q: int(q[1:])))
def test_each_reference_gives_rows_with_the_columns_of_its_sink_table(events, query):
    if query in PROCESSING_TIME:  # read at one bid per millisecond from the first bid's time on
        events = reference.Events(events.person, events.auction, events.bid.assign(
            p_time=events.bid.dateTime.min() + pd.to_timedelta(range(len(events.bid)), unit="ms")))
    expected = reference.QUERIES[query](events)
    assert list(expected.columns) == [name for name, _ in sink_columns(query)]
    assert len(expected) > 0, f"{query}: no rows on the shared events, so its example's test would prove little"


@pytest.mark.parametrize("query", EXPRESSIBLE)
def test_example_output_equals_the_reference(spark, nexmark_dir, events, query, tmp_path, monkeypatch):
    monkeypatch.delenv("NEXMARK_SIDE_INPUT", raising=False)
    began = pd.Timestamp.now(tz="UTC")
    committed = run_example(spark, query, tmp_path, monkeypatch, NEXMARK_INPUT=str(nexmark_dir),
                           NEXMARK_FILES_PER_EPOCH="5")
    ended = pd.Timestamp.now(tz="UTC")
    if query in FIRED_BY_WATERMARK:
        epochs = sorted(set(committed.column("epoch").to_pylist()))
        assert len(epochs) >= 2, f"{query}: every row came out in epoch(s) {epochs}: the watermark fired nothing"
    got = final_result(query, committed)
    if query in PROCESSING_TIME:
        windows = got.to_pandas().starttime
        assert windows.min() >= began.floor("10 s") and windows.max() <= ended, \
            f"{query}: windows {sorted(set(windows))} are not of the run's time, {began} to {ended}"
        events = read_at(events, nexmark_dir, got.to_pandas())
    expected = reference.QUERIES[query](events)
    assert_sink_schema(query, got.schema)
    assert_same_rows(got.to_pandas(), expected)


def test_q11_emits_sessions_by_the_watermark_on_sparse_bids(spark, tmp_path_factory, tmp_path, monkeypatch):
    # 5 000 events at 25 per second span 200 s: a bidder bids about every 20 s, so sessions
    # end all along the input. Four epochs of 50 s each.
    sparse = tmp_path_factory.mktemp("nexmark-sparse")
    write_parquet(str(sparse), 5_000, NexmarkConfig(seed=SEED, rate=25), files_per_stream=FILES)
    committed = run_example(spark, "q11", tmp_path, monkeypatch, NEXMARK_INPUT=str(sparse),
                            NEXMARK_FILES_PER_EPOCH="5")
    epochs = committed.column("epoch").to_pylist()
    assert len(set(epochs)) >= 3, f"q11: sessions came out in epochs {sorted(set(epochs))} only"
    assert_same_rows(final_result("q11", committed).to_pandas(), reference.q11(reference.load(str(sparse))))


def test_an_example_reads_the_generator_when_no_input_directory_is_named(spark, tmp_path, monkeypatch):
    monkeypatch.delenv("NEXMARK_INPUT", raising=False)
    got = final_result("q0", run_example(spark, "q0", tmp_path, monkeypatch, NEXMARK_EVENTS=str(EVENTS),
                                         NEXMARK_SEED="4"))
    generated = NexmarkGenerator(NexmarkConfig(seed=4)).events(0, EVENTS)
    expected = reference.q0(reference.Events(*(generated.stream(s).to_pandas() for s in STREAMS)))
    assert_same_rows(got.to_pandas(), expected)


@pytest.mark.parametrize("stream", STREAMS)
def test_the_generator_source_reads_each_stream_in_any_slicing_as_the_generator_makes_it(spark, stream):
    source = NexmarkSource(stream, events=7_000, seed=3, max_events_per_epoch=3_000, chunk_events=1_100)
    source.open(SourceContext(spark, "nexmark"))
    positions, frames = source.initial_positions(), []
    while not source.is_exhausted(positions):
        plan = source.plan(positions)
        frames.append(source.read(plan).toPandas())
        positions = plan.end
    assert len(frames) == 3
    got = pd.concat(frames, ignore_index=True)
    expected = NexmarkGenerator(NexmarkConfig(seed=3)).events(0, 7_000).stream(stream).to_pandas()
    assert list(got.columns) == list(expected.columns)
    assert_same_rows(got, expected)
    empty = source.read(SlicePlan({"events": 7_000}, {"events": 7_000}))
    assert empty.count() == 0 and empty.columns == list(expected.columns)


def test_a_missing_stream_directory_is_one_line_naming_the_command_that_writes_it(tmp_path, monkeypatch):
    from sparkpoint.errors import ConfigError

    monkeypatch.setenv("NEXMARK_INPUT", str(tmp_path))
    with pytest.raises(ConfigError, match=r"has no bid/ directory: write the input with `sparkpoint nexmark generate"):
        nexmark_input("bid")


def test_the_input_directory_is_read_in_file_name_order(nexmark_dir, monkeypatch):
    monkeypatch.setenv("NEXMARK_INPUT", str(nexmark_dir))
    source = nexmark_input("bid")
    files = sorted(os.listdir(nexmark_dir / "bid"))
    assert len(files) == FILES
    first = source.plan(source.initial_positions())
    assert first.end == {"dir": files[:10]} and not source.is_exhausted(first.end)
    second = source.plan(first.end)
    assert second.end == {"dir": files} and source.is_exhausted(second.end)
    monkeypatch.setenv("NEXMARK_FILES_PER_EPOCH", "5")
    assert nexmark_input("bid").plan(source.initial_positions()).end == {"dir": files[:5]}
