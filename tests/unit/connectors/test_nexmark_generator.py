"""The Nexmark generator makes the streams nexmark-flink's generator makes: its 1:3:46
cycle, its id rules, its event-time spacing, its hot auctions, sellers and bidders and its
DDL's columns, the same rows for a seed however the range is chunked, and a command that
writes them to Parquet. Expected values come from the rules written out here per event, in
plain integer arithmetic, not from the generator's own helpers."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from sparkpoint.connectors.nexmark import NexmarkConfig, NexmarkGenerator
from sparkpoint.ops.cli import cli

BASE = NexmarkConfig().base_time_ms
TS = pa.timestamp("ms", tz="UTC")

# nexmark-flink's DDL (ddl_views.sql / the datagen table's ROW types), column for column.
DDL = {
    "person": [("id", pa.int64()), ("name", pa.string()), ("emailAddress", pa.string()),
               ("creditCard", pa.string()), ("city", pa.string()), ("state", pa.string()),
               ("dateTime", TS), ("extra", pa.string())],
    "auction": [("id", pa.int64()), ("itemName", pa.string()), ("description", pa.string()),
                ("initialBid", pa.int64()), ("reserve", pa.int64()), ("dateTime", TS), ("expires", TS),
                ("seller", pa.int64()), ("category", pa.int64()), ("extra", pa.string())],
    "bid": [("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()), ("channel", pa.string()),
            ("url", pa.string()), ("dateTime", TS), ("extra", pa.string())],
}


def numbers_of(kind: str, count: int) -> list[int]:
    """Event numbers of one kind among events 0 .. count - 1 under the 1:3:46 cycle."""
    slots = {"person": range(0, 1), "auction": range(1, 4), "bid": range(4, 50)}[kind]
    return [n for n in range(count) if n % 50 in slots]


def newest_person(n: int) -> int:  # base 0: one person per cycle of 50, at its start
    return n // 50


def newest_auction(n: int) -> int:  # base 0: three auctions per cycle, in slots 1..3
    cycle, slot = divmod(n, 50)
    return cycle * 3 - 1 if slot == 0 else cycle * 3 + min(slot, 3) - 1


def millis(column) -> list[int]:
    return column.cast(pa.int64()).to_pylist()


@pytest.fixture(scope="module")
def events46k():
    return NexmarkGenerator(NexmarkConfig(seed=11)).events(0, 46 * 1000)


def test_46000_events_split_1_3_46_with_dense_ids_from_1000(events46k):
    cycles = 46 * 1000 // 50
    assert (events46k.person.num_rows, events46k.auction.num_rows, events46k.bid.num_rows) == \
        (cycles, 3 * cycles, 46 * cycles)
    assert events46k.person.column("id").to_pylist() == list(range(1000, 1000 + cycles))
    assert events46k.auction.column("id").to_pylist() == list(range(1000, 1000 + 3 * cycles))


def test_event_times_are_spaced_by_the_rate_in_every_stream():
    count = 5_000
    for rate in (10_000, 2_500, 3):
        got = NexmarkGenerator(NexmarkConfig(rate=rate)).events(0, count)
        for kind in ("person", "auction", "bid"):
            # 1e6 / rate microseconds (a double, as nexmark keeps it) between consecutive
            # events; the product truncated to whole microseconds, then to milliseconds.
            expected = [BASE + int(n * (1_000_000 / rate)) // 1000 for n in numbers_of(kind, count)]
            times = millis(got.stream(kind).column("dateTime"))
            assert times == expected, (rate, kind)
            assert times == sorted(times)


def test_the_same_seed_and_range_give_the_same_rows_however_it_is_chunked():
    generator = NexmarkGenerator(NexmarkConfig(seed=5))
    whole = generator.events(0, 12_345)
    sizes = [1, 49, 50, 3_000, 7, 9_238]
    assert sum(sizes) == 12_345
    starts = list(itertools.accumulate([0] + sizes[:-1]))
    parts = [NexmarkGenerator(NexmarkConfig(seed=5)).events(start, size) for start, size in zip(starts, sizes)]
    for kind in ("person", "auction", "bid"):
        joined = pa.concat_tables([part.stream(kind) for part in parts])
        assert joined.equals(whole.stream(kind)), kind
    chunked = list(generator.chunks(0, 12_345, chunk_events=1_000))
    for kind in ("person", "auction", "bid"):
        assert pa.concat_tables([c.stream(kind) for c in chunked]).equals(whole.stream(kind)), kind


def test_a_range_longer_than_one_internal_slice_is_the_same_as_its_chunks(monkeypatch):
    import sparkpoint.connectors.nexmark as nexmark

    whole = NexmarkGenerator().events(0, 2_500)
    monkeypatch.setattr(nexmark, "_SLICE", 300)
    for kind in ("person", "auction", "bid"):
        assert NexmarkGenerator().events(0, 2_500).stream(kind).equals(whole.stream(kind)), kind


def test_an_unbounded_stream_continues_where_the_bounded_range_ends():
    generator = NexmarkGenerator()
    first_three = list(itertools.islice(generator.chunks(chunk_events=700), 3))
    assert pa.concat_tables([c.bid for c in first_three]).equals(generator.events(0, 2_100).bid)


def test_another_seed_changes_the_values_but_not_the_ids_or_times():
    a = NexmarkGenerator(NexmarkConfig(seed=1)).events(0, 2_000)
    b = NexmarkGenerator(NexmarkConfig(seed=2)).events(0, 2_000)
    assert a.auction.column("id").equals(b.auction.column("id"))
    assert a.bid.column("dateTime").equals(b.bid.column("dateTime"))
    assert a.bid.column("price").to_pylist() != b.bid.column("price").to_pylist()
    assert a.person.column("extra").to_pylist() != b.person.column("extra").to_pylist()


def test_schemas_are_the_ddl_columns_and_types(events46k):
    for kind, columns in DDL.items():
        assert events46k.stream(kind).schema == pa.schema(columns), kind
    empty = NexmarkGenerator().events(0, 0)
    for kind, columns in DDL.items():
        assert empty.stream(kind).schema == pa.schema(columns) and empty.stream(kind).num_rows == 0


def test_bids_point_at_open_or_hot_auctions_and_at_active_or_hot_bidders(events46k):
    bids = events46k.bid
    hot_auctions = hot_bidders = 0
    for n, auction, bidder in zip(numbers_of("bid", 46_000), bids.column("auction").to_pylist(),
                                  bids.column("bidder").to_pylist()):
        newest = newest_auction(n)
        hot = 1000 + newest // 100 * 100
        hot_auctions += auction == hot
        # Otherwise one of the last 100 auctions (in flight), or up to 10 not yet opened.
        assert auction == hot or 1000 + max(newest - 100, 0) <= auction <= 1000 + newest + 10, (n, auction)
        people = newest_person(n) + 1
        hot_bidder = 1000 + (people - 1) // 100 * 100 + 1
        hot_bidders += bidder == hot_bidder
        assert bidder == hot_bidder or 1000 + max(people - 1000, 0) <= bidder < 1000 + people + 10, (n, bidder)
    # Hot with probability 1 - 1/2 (auctions) and 1 - 1/4 (bidders), plus the odd random hit.
    assert 0.48 < hot_auctions / bids.num_rows < 0.53
    assert 0.74 < hot_bidders / bids.num_rows < 0.78
    # Every auction a bid names exists by the end of the stream, except the last few leads.
    opened = set(events46k.auction.column("id").to_pylist())
    assert {a for a in bids.column("auction").to_pylist() if a not in opened} <= set(range(1000 + 3 * 920, 1000 + 3 * 920 + 10))


def test_sellers_are_active_or_hot_people(events46k):
    auctions = events46k.auction
    hot_sellers = 0
    for n, seller in zip(numbers_of("auction", 46_000), auctions.column("seller").to_pylist()):
        people = newest_person(n) + 1
        hot = 1000 + (people - 1) // 100 * 100
        hot_sellers += seller == hot
        assert seller == hot or 1000 + max(people - 1000, 0) <= seller < 1000 + people + 10, (n, seller)
    assert 0.74 < hot_sellers / auctions.num_rows < 0.78
    known = set(events46k.person.column("id").to_pylist())
    assert {s for s in auctions.column("seller").to_pylist() if s not in known} <= set(range(1000 + 920, 1000 + 930))


def test_auction_prices_expiry_and_categories_follow_nexmark(events46k):
    rows = events46k.auction.to_pydict()
    for n, created, expires in zip(numbers_of("auction", 46_000), millis(events46k.auction.column("dateTime")),
                                   millis(events46k.auction.column("expires"))):
        # Open for up to twice the time it takes to open 100 more auctions (1666 events).
        horizon = BASE + ((n + 1666) * 100) // 1000 - created
        assert created < expires <= created + 2 * horizon
    assert all(100 <= p <= 100_000_000 for p in rows["initialBid"])
    assert all(r > i for r, i in zip(rows["reserve"], rows["initialBid"]))
    assert set(rows["category"]) == {10, 11, 12, 13, 14}
    assert all(1 <= len(name) <= 19 and name == name.strip() for name in rows["itemName"])
    assert all(1 <= len(d) <= 99 and d == d.strip() for d in rows["description"])
    # Log-uniform prices: about half are below 10^3 units (10^5 cents).
    below = sum(p < 100_000 for p in rows["initialBid"]) / len(rows["initialBid"])
    assert 0.45 < below < 0.55


def test_people_have_nexmark_shaped_names_cities_cards_and_emails(events46k):
    rows = events46k.person.to_pydict()
    assert all(re.fullmatch(r"[A-Z][a-z]+ [A-Z][a-z]+", name) for name in rows["name"])
    assert set(rows["state"]) == {"AZ", "CA", "ID", "OR", "WA", "WY"}
    assert len(set(rows["city"])) == 10
    assert all(re.fullmatch(r"\d{4} \d{4} \d{4} \d{4}", card) for card in rows["creditCard"])
    assert all(re.fullmatch(r"[a-z][a-z ]*[a-z]@[a-z]([a-z ]*[a-z])?\.com|[a-z]@[a-z]([a-z ]*[a-z])?\.com", e)
               for e in rows["emailAddress"])


def test_bid_channels_keep_one_url_each_and_rows_average_nexmark_sizes(events46k):
    rows = events46k.bid.to_pydict()
    url_of: dict[str, str] = {}
    for channel, url in zip(rows["channel"], rows["url"]):
        assert url_of.setdefault(channel, url) == url
        assert url.startswith("https://www.nexmark.com/") and "/item.htm?query=1" in url
    hot_channels = ("Google", "Facebook", "Baidu", "Apple")
    hot = sum(c in hot_channels for c in rows["channel"]) / len(rows["channel"])
    assert 0.48 < hot < 0.52
    assert all(c in hot_channels or re.fullmatch(r"channel-\d{1,4}", c) for c in rows["channel"])
    # A bid's four longs (32 bytes) plus `extra` average 100 bytes, as nexmark sizes them.
    average = 32 + sum(len(e) for e in rows["extra"]) / len(rows["extra"])
    assert 98 < average < 102
    assert all(100 <= p <= 100_000_000 for p in rows["price"])


def test_a_bad_config_is_refused_with_one_line():
    with pytest.raises(ValueError, match="rate must be positive"):
        NexmarkConfig(rate=0)
    with pytest.raises(ValueError, match="avg_bid_bytes must be between 0 and"):
        NexmarkConfig(avg_bid_bytes=10**9)
    with pytest.raises(ValueError, match="first event >= 0"):
        NexmarkGenerator().events(-1, 10)


def test_the_command_writes_each_stream_in_event_time_order_across_files(tmp_path: Path):
    out = tmp_path / "nexmark"
    done = CliRunner().invoke(cli, ["nexmark", "generate", "--events", "5000", "--out", str(out),
                                    "--seed", "3", "--rate", "2000", "--files-per-stream", "3"])
    assert done.exit_code == 0, done.output
    assert "person 100, auction 300, bid 4600" in done.output
    expected = NexmarkGenerator(NexmarkConfig(seed=3, rate=2000)).events(0, 5000)
    for kind, columns in DDL.items():
        files = sorted((out / kind).iterdir())
        assert [f.name for f in files] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
        read = pa.concat_tables([pq.read_table(f) for f in files])
        assert read.schema == pa.schema(columns)
        assert read.equals(expected.stream(kind)), kind
        times = millis(read.column("dateTime"))
        assert times == sorted(times)
        timestamp = pq.ParquetFile(files[0]).schema.column(
            [c for c, _ in columns].index("dateTime")).logical_type
        assert json.loads(timestamp.to_json())["isAdjustedToUTC"] is True
        assert json.loads(timestamp.to_json())["timeUnit"] == "milliseconds"


def test_the_command_refuses_a_directory_that_already_holds_events(tmp_path: Path):
    runner = CliRunner()
    assert runner.invoke(cli, ["nexmark", "generate", "--events", "100", "--out", str(tmp_path)]).exit_code == 0
    again = runner.invoke(cli, ["nexmark", "generate", "--events", "100", "--out", str(tmp_path)])
    assert again.exit_code == 1
    assert again.output.strip() == (f"Error: {tmp_path / 'person'} is not empty: choose a new output directory "
                                    f"or delete it first")
