"""The pandas references themselves, on inputs of a few rows whose answer is plain from
nexmark-flink's SQL: window and BETWEEN boundaries, ties, truncating averages, what a
regular expression that does not match gives. The example tests trust the references;
these are why they may."""

from __future__ import annotations

from decimal import Decimal

import pandas as pd
import pytest

from tests.nexmark import reference
from tests.nexmark.reference import Events
from tests.nexmark.rows import assert_same_rows

T0 = pd.Timestamp("2023-11-14 22:13:20", tz="UTC")


def at(seconds: float) -> pd.Timestamp:
    return T0 + pd.Timedelta(seconds=seconds)


def person(id, state="OR", name=None, at_s=0.0, city="Bend"):
    return {"id": id, "name": name or f"person {id}", "emailAddress": "a@b.com", "creditCard": "1234 5678 9012 3456",
            "city": city, "state": state, "dateTime": at(at_s), "extra": ""}


def auction(id, seller=1, category=10, at_s=0.0, expires_s=100.0):
    return {"id": id, "itemName": f"item {id}", "description": "d", "initialBid": 1, "reserve": 2,
            "dateTime": at(at_s), "expires": at(expires_s), "seller": seller, "category": category,
            "extra": f"auction extra {id}"}


def bid(auction=1, price=10, at_s=0.0, bidder=7, channel="channel-1", url="https://www.nexmark.com/a/b/c/item.htm",
        extra="x"):
    return {"auction": auction, "bidder": bidder, "price": price, "channel": channel, "url": url,
            "dateTime": at(at_s), "extra": extra}


def events(people=(), auctions=(), bids=(), side_input=None) -> Events:
    def frame(rows, like):
        return pd.DataFrame(list(rows), columns=list(like().keys()))
    return Events(frame(people, lambda: person(0)), frame(auctions, lambda: auction(0)), frame(bids, bid), side_input)


def expect(rows: list[tuple], columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=columns)


def test_q0_passes_every_bid_with_its_five_columns():
    e = events(bids=[bid(price=5, at_s=1), bid(price=5, at_s=1)])
    assert_same_rows(reference.q0(e), expect([(1, 7, 5, at(1), "x")] * 2,
                                             ["auction", "bidder", "price", "dateTime", "extra"]))


def test_q1_converts_prices_to_euros_exactly():
    e = events(bids=[bid(price=1), bid(price=1000), bid(price=123_456_789)])
    got = reference.q1(e)
    assert list(got.columns) == ["auction", "bidder", "price", "dateTime", "extra"]
    assert sorted(got.price) == [Decimal("0.908"), Decimal("908"), Decimal("112098764.412")]


def test_q2_keeps_bids_on_every_123rd_auction():
    e = events(bids=[bid(auction=123, price=1), bid(auction=124, price=2), bid(auction=246, price=3)])
    assert_same_rows(reference.q2(e), expect([(123, 1), (246, 3)], ["auction", "price"]))


def test_q3_joins_category_10_auctions_with_sellers_in_or_id_ca():
    e = events(people=[person(1, "OR", city="Bend"), person(2, "WA"), person(3, "CA", city="Kent")],
               auctions=[auction(1000, seller=1), auction(1001, seller=2), auction(1002, seller=1, category=11),
                         auction(1003, seller=3), auction(1004, seller=99)])
    assert_same_rows(reference.q3(e), expect([("person 1", "Bend", "OR", 1000), ("person 3", "Kent", "CA", 1003)],
                                             ["name", "city", "state", "id"]))


def test_q4_averages_winning_prices_per_category_truncated_counting_bids_while_open_only():
    e = events(auctions=[auction(1, category=10, at_s=0, expires_s=100), auction(2, category=10, at_s=0),
                         auction(3, category=11, at_s=50)],
               bids=[bid(1, 50, at_s=5), bid(1, 70, at_s=100.001), bid(1, 60, at_s=100),  # BETWEEN includes expires
                     bid(2, 7, at_s=0),                                              # ... and the opening instant
                     bid(3, 999, at_s=49.999)])                                      # before it opened
    assert_same_rows(reference.q4(e), expect([(10, 33)], ["id", "final"]))  # (60 + 7) / 2 = 33.5 -> 33


def test_q6_averages_each_sellers_last_winning_prices_in_the_order_their_auctions_close():
    # seller 1's auctions close at 10, 20, 30, 30 (id 4 before id 5), 40; seller 2's at 15
    e = events(auctions=[auction(1, seller=1, expires_s=10), auction(2, seller=1, expires_s=20),
                         auction(5, seller=1, expires_s=30), auction(4, seller=1, expires_s=30),
                         auction(3, seller=1, expires_s=40), auction(6, seller=2, expires_s=15),
                         auction(7, seller=2, expires_s=50)],  # no bid while open: no row
               bids=[bid(1, 10, at_s=9), bid(1, 30, at_s=1),      # the winner is the highest, not the last
                     bid(2, 40, at_s=19), bid(3, 5, at_s=2), bid(4, 61, at_s=3), bid(5, 100, at_s=4),
                     bid(6, 7, at_s=5), bid(7, 99, at_s=51)])
    # last 3: 30 | 30, 40 | 30, 40, 61 | 40, 61, 100 | 61, 100, 5 (the frame drops the oldest)
    assert_same_rows(reference.q6(e, last=3), expect([("1", 30), ("1", 35), ("1", 43), ("1", 67), ("1", 55),
                                                      ("2", 7)], ["seller", "avg_price"]))
    # nexmark's last 10 by default: here every auction of the seller so far
    assert_same_rows(reference.q6(e), expect([("1", 30), ("1", 35), ("1", 43), ("1", 57), ("1", 47), ("2", 7)],
                                             ["seller", "avg_price"]))


def test_q7_finds_each_windows_highest_bids_and_a_bid_at_a_windows_end_matches_it_too():
    e = events(bids=[bid(price=5, at_s=1, bidder=1), bid(price=9, at_s=3, bidder=2), bid(price=9, at_s=7, bidder=3),
                     # the first instant of the next window: its maximum, and the previous window's (BETWEEN)
                     bid(price=9, at_s=10, bidder=4), bid(price=3, at_s=15, bidder=5),
                     bid(price=8, at_s=21, bidder=6), bid(price=9, at_s=29, bidder=7)])
    columns = ["auction", "bidder", "price", "dateTime", "extra"]
    assert_same_rows(reference.q7(e), expect([(1, 2, 9, at(3), "x"), (1, 3, 9, at(7), "x"),
                                              (1, 4, 9, at(10), "x"), (1, 4, 9, at(10), "x"),
                                              (1, 7, 9, at(29), "x")], columns))


def test_q8_finds_people_who_opened_an_auction_in_the_window_they_registered_in():
    # T0 is a multiple of 10 s: [T0, T0 + 10 s) is one window.
    e = events(people=[person(1, at_s=2), person(2, at_s=9), person(3, at_s=21)],
               auctions=[auction(10, seller=1, at_s=8), auction(11, seller=2, at_s=11),
                         auction(12, seller=3, at_s=22), auction(13, seller=3, at_s=29)])
    assert_same_rows(reference.q8(e), expect([(1, "person 1", at(0)), (3, "person 3", at(20))],
                                             ["id", "name", "stime"]))


def test_q9_picks_the_highest_then_earliest_then_first_bid_while_the_auction_is_open():
    e = events(auctions=[auction(1, at_s=0, expires_s=100), auction(2, at_s=0), auction(3, at_s=0)],
               bids=[bid(1, 50, at_s=10, bidder=1), bid(1, 50, at_s=5, bidder=2), bid(1, 40, at_s=3, bidder=3),
                     bid(1, 99, at_s=101, bidder=4),
                     bid(2, 70, at_s=20, bidder=5), bid(2, 70, at_s=20, bidder=6)])
    got = reference.q9(e)
    assert list(got.columns) == ["id", "itemName", "description", "initialBid", "reserve", "dateTime", "expires",
                                 "seller", "category", "extra", "auction", "bidder", "price", "bid_dateTime",
                                 "bid_extra"]
    assert sorted(zip(got.id, got.bidder, got.price, got.bid_dateTime)) == [(1, 2, 50, at(5)), (2, 5, 70, at(20))]


def test_q10_adds_the_utc_day_and_minute():
    e = events(bids=[bid(at_s=0), bid(at_s=(23 * 3600 + 59 * 60 + 59.999) - (22 * 3600 + 13 * 60 + 20)),
                     bid(at_s=(24 * 3600) - (22 * 3600 + 13 * 60 + 20))])
    got = reference.q10(e)
    assert list(got.columns) == ["auction", "bidder", "price", "dateTime", "extra", "dt", "hm"]
    assert sorted(zip(got.dt, got.hm)) == [("2023-11-14", "22:13"), ("2023-11-14", "23:59"), ("2023-11-15", "00:00")]


def test_q11_counts_each_bidders_sessions_a_gap_of_exactly_10_s_keeping_one_session():
    e = events(bids=[bid(bidder=1, at_s=0), bid(bidder=1, at_s=4), bid(bidder=1, at_s=14),  # 10 s after 4: touches
                     bid(bidder=1, at_s=24.001),                                            # over 10 s: a new one
                     bid(bidder=2, at_s=3), bid(bidder=1, at_s=30)])                        # bidders apart
    assert_same_rows(reference.q11(e), expect([(1, 3, at(0), at(24)), (1, 2, at(24.001), at(40)),
                                               (2, 1, at(3), at(13))],
                                              ["bidder", "bid_count", "starttime", "endtime"]))


def test_q12_counts_each_bidders_bids_per_10_s_window_of_the_processing_time_they_were_read_at():
    read_at = [T0 + pd.Timedelta(seconds=s) for s in (0, 9.999, 10, 10, 35)]
    e = events(bids=[bid(bidder=1, at_s=500), bid(bidder=1), bid(bidder=1), bid(bidder=2), bid(bidder=1)])
    e = Events(e.person, e.auction, e.bid.assign(p_time=read_at))
    assert_same_rows(reference.q12(e), expect([(1, 2, at(0), at(10)), (1, 1, at(10), at(20)), (2, 1, at(10), at(20)),
                                               (1, 1, at(30), at(40))],
                                              ["bidder", "bid_count", "starttime", "endtime"]))
    with pytest.raises(ValueError, match="processing time"):
        reference.q12(events(bids=[bid()]))  # event time is no stand-in for it


def test_q13_enriches_bids_by_auction_modulo_10000(tmp_path):
    from sparkpoint.connectors.nexmark_io import write_side_input

    path = str(tmp_path / "side_input.csv")
    write_side_input(path)
    side = reference.read_side_input(path)
    # nexmark-flink's SideInputGenerator: keys 0 .. 9999, each with its own digits as value.
    assert side.key.tolist() == list(range(10_000)) and side.value.tolist() == [str(k) for k in range(10_000)]
    e = events(bids=[bid(auction=10007, price=1), bid(auction=20000, price=2)], side_input=side)
    assert_same_rows(reference.q13(e), expect([(10007, 7, 1, at(0), "7"), (20000, 7, 2, at(0), "0")],
                                              ["auction", "bidder", "price", "dateTime", "value"]))


def test_q14_keeps_the_price_band_and_names_the_time_of_day():
    day = lambda h, m=0: (h * 3600 + m * 60) - (22 * 3600 + 13 * 60 + 20) + 24 * 3600  # next day, h:m UTC
    e = events(bids=[bid(price=1_101_322, at_s=day(8)),          # 1 000 000.376 euros: in
                     bid(price=1_101_321, at_s=day(8)),          #   999 999.468: out
                     bid(price=55_066_079, at_s=day(18, 59)),    # 49 999 999.732: in
                     bid(price=55_066_080, at_s=day(8)),         # 50 000 000.640: out
                     bid(price=2_000_000, at_s=day(19), extra="abcc"),
                     bid(price=2_000_000, at_s=day(7, 30)),
                     bid(price=2_000_000, at_s=day(6, 59)),
                     bid(price=2_000_000, at_s=day(20))])
    got = reference.q14(e)
    assert list(got.columns) == ["auction", "bidder", "price", "bidTimeType", "dateTime", "extra", "c_counts"]
    assert sorted(zip(got.price, got.bidTimeType, got.c_counts)) == [
        (Decimal("1000000.376"), "dayTime", 0), (Decimal("1816000"), "nightTime", 0),
        (Decimal("1816000"), "nightTime", 0), (Decimal("1816000"), "otherTime", 0),
        (Decimal("1816000"), "otherTime", 2), (Decimal("49999999.732"), "dayTime", 0)]


def test_q20_joins_bids_with_their_category_10_auction():
    e = events(auctions=[auction(1, category=10, at_s=1), auction(2, category=11)],
               bids=[bid(1, 5, at_s=3, extra="b1"), bid(2, 6), bid(3, 7)])
    got = reference.q20(e)
    assert list(got.columns) == ["auction", "bidder", "price", "channel", "url", "bid_dateTime", "bid_extra",
                                 "itemName", "description", "initialBid", "reserve", "auction_dateTime", "expires",
                                 "seller", "category", "auction_extra"]
    assert got[["auction", "price", "bid_dateTime", "bid_extra", "auction_dateTime", "auction_extra"]].values.tolist() \
        == [[1, 5, at(3), "b1", at(1), "auction extra 1"]]


@pytest.mark.parametrize("channel, url, channel_id", [
    ("Apple", "https://x/item.htm", "0"),
    ("GOOGLE", "https://x/item.htm&channel_id=9", "1"),   # a hot channel's id wins over the URL's
    ("Facebook", "https://x", "2"),
    ("baidu", "https://x", "3"),
    ("channel-5", "https://x/item.htm?query=1&channel_id=77", "77"),
    ("channel-5", "channel_id=5&query=1", "5"),            # (&|^): at the start too
    ("channel-5", "https://x/item.htm?query=1&channel_id=&a=1", ""),  # matched, empty: not NULL
    ("channel-6", "https://x/item.htm?query=1", None),      # no match: NULL, left out
    ("channel-6", "https://x/item.htm?xchannel_id=3", None),
])
def test_q21_takes_the_channel_id_from_the_channel_or_the_url(channel, url, channel_id):
    got = reference.q21(events(bids=[bid(channel=channel, url=url)]))
    assert list(got.columns) == ["auction", "bidder", "price", "channel", "channel_id"]
    assert got.channel_id.tolist() == ([] if channel_id is None else [channel_id])
