"""Nexmark's queries computed directly with pandas, the oracle the example pipelines are
checked against. Nothing here shares code with sparkpoint or the examples: each query is
nexmark-flink's SQL (nexmark-flink/src/main/resources/queries/qN.sql) read as a batch
query over the whole input, which is what the streaming query emits once a bounded input
has ended (every window fired, every join matched). Each function returns the rows of
nexmark-flink's sink table for that query, with its column names, in no particular order.

Times are pandas timestamps in UTC, as the generator writes them; windows are aligned to
the epoch, as Flink's TUMBLE is. Where the SQL leaves a choice to the engine, the
docstring says which one is taken here.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Callable

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

WINDOW = pd.Timedelta(seconds=10)
CHANNEL_ID = re.compile(r"(&|^)channel_id=([^&]*)")
HOT_CHANNEL_IDS = {"apple": "0", "google": "1", "facebook": "2", "baidu": "3"}


@dataclass(frozen=True)
class Events:
    """The three streams, each in the order its files hold it (its index is that order)."""

    person: pd.DataFrame
    auction: pd.DataFrame
    bid: pd.DataFrame
    side_input: pd.DataFrame | None = None  # q13's table: key, value


def load(directory: str, side_input: str | None = None) -> Events:
    """The streams under `directory` (person/, auction/, bid/), files in name order."""
    def stream(name: str) -> pd.DataFrame:
        files = sorted(glob.glob(os.path.join(directory, name, "*.parquet")))
        return pa.concat_tables([pq.read_table(f) for f in files]).to_pandas()

    side = read_side_input(side_input) if side_input is not None else None
    return Events(stream("person"), stream("auction"), stream("bid"), side)


def read_side_input(path: str) -> pd.DataFrame:
    """q13's side input: CSV lines `key,value`, no header (nexmark-flink's side_input.txt)."""
    return pd.read_csv(path, header=None, names=["key", "value"], dtype={"key": "int64", "value": str},
                       keep_default_na=False)


def _euros(price: pd.Series) -> pd.Series:
    """0.908 * price as DECIMAL(23, 3): exact, as Flink multiplies decimals."""
    return price.map(lambda p: Decimal(int(p) * 908).scaleb(-3))


def q0(e: Events) -> pd.DataFrame:
    """SELECT auction, bidder, price, dateTime, extra FROM bid"""
    return e.bid[["auction", "bidder", "price", "dateTime", "extra"]]


def q1(e: Events) -> pd.DataFrame:
    """SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid"""
    b = e.bid
    return pd.DataFrame({"auction": b.auction, "bidder": b.bidder, "price": _euros(b.price),
                         "dateTime": b.dateTime, "extra": b.extra})


def q2(e: Events) -> pd.DataFrame:
    """SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0"""
    return e.bid.loc[e.bid.auction % 123 == 0, ["auction", "price"]]


def q3(e: Events) -> pd.DataFrame:
    """SELECT P.name, P.city, P.state, A.id FROM auction A JOIN person P ON A.seller = P.id
    WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')"""
    a = e.auction[e.auction.category == 10]
    p = e.person[e.person.state.isin(["OR", "ID", "CA"])]
    m = a.merge(p, left_on="seller", right_on="id", suffixes=("_a", "_p"))
    return pd.DataFrame({"name": m.name, "city": m.city, "state": m.state, "id": m.id_a})


def _bids_while_open(e: Events) -> pd.DataFrame:
    """auction A, bid B WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
    (both ends included): the auction's columns as they are, the bid's prefixed `bid_`."""
    bids = e.bid.rename(columns=lambda c: f"bid_{c}").assign(bid_order=range(len(e.bid)))
    m = e.auction.merge(bids, left_on="id", right_on="bid_auction")
    return m[(m.bid_dateTime >= m.dateTime) & (m.bid_dateTime <= m.expires)]


def q4(e: Events) -> pd.DataFrame:
    """The average winning price per category: SELECT category, AVG(final) FROM (SELECT
    MAX(B.price) AS final, A.category FROM <bids while open> GROUP BY A.id, A.category)
    GROUP BY category, into the sink's (id, final). AVG of a BIGINT is a BIGINT in Flink:
    the sum divided by the count, truncated."""
    winning = _bids_while_open(e).groupby(["id", "category"]).bid_price.max().reset_index()
    per_category = winning.groupby("category").bid_price.agg(["sum", "count"]).reset_index()
    return pd.DataFrame({"id": per_category["category"],
                         "final": [int(s) // int(n) for s, n in zip(per_category["sum"], per_category["count"])]})


def q5(e: Events) -> pd.DataFrame:
    """Per 10 s window every 2 s (HOP), the auctions with the most bids: count(*) per
    auction and window, joined with the window's max(count) on num >= maxn."""
    size, slide = pd.Timedelta(seconds=10), pd.Timedelta(seconds=2)
    rows = []
    for k in range(size // slide):  # a bid at t is in the windows starting at floor(t, slide) - k * slide
        start = e.bid.dateTime.dt.floor(slide) - k * slide
        rows.append(pd.DataFrame({"auction": e.bid.auction, "start": start}))
    counts = pd.concat(rows).groupby(["start", "auction"]).size().rename("num").reset_index()
    maxn = counts.groupby("start").num.transform("max")
    return counts[counts.num >= maxn][["auction", "num"]].reset_index(drop=True)


def q11(e: Events) -> pd.DataFrame:
    """Bids per bidder and session: GROUP BY bidder, SESSION(dateTime, INTERVAL '10' SECOND).
    A bidder's session runs from its first bid to 10 s after its last; a bid more than 10 s
    after the one before it (by time) opens the next session, a bid exactly 10 s after it
    (spans that touch) stays in the same one, as Flink merges session windows."""
    gap = pd.Timedelta(seconds=10)
    b = e.bid[["bidder", "dateTime"]].sort_values(["bidder", "dateTime"], kind="stable")
    after = b.groupby("bidder").dateTime.diff()
    session = (after.isna() | (after > gap)).cumsum()
    sessions = b.groupby(session).agg(bidder=("bidder", "first"), bid_count=("dateTime", "size"),
                                      starttime=("dateTime", "min"), last=("dateTime", "max"))
    return pd.DataFrame({"bidder": sessions.bidder, "bid_count": sessions.bid_count.astype("int64"),
                         "starttime": sessions.starttime, "endtime": sessions["last"] + gap}).reset_index(drop=True)


def q12(e: Events) -> pd.DataFrame:
    """Bids per bidder and 10 s window of processing time: GROUP BY bidder, TUMBLE(p_time,
    10 s), p_time = PROCTIME(). Processing time belongs to a run, not to the events:
    `e.bid` must carry it as the column `p_time`, the processing time at which each bid was
    read (tests/nexmark/processing_time.py recovers it from a run's result)."""
    if "p_time" not in e.bid.columns:
        raise ValueError("q12 needs each bid's processing time: e.bid.p_time")
    start = e.bid.p_time.dt.floor(WINDOW)
    counts = e.bid.groupby([e.bid.bidder, start.rename("starttime")]).size().rename("bid_count").reset_index()
    return pd.DataFrame({"bidder": counts.bidder, "bid_count": counts.bid_count.astype("int64"),
                         "starttime": counts.starttime, "endtime": counts.starttime + WINDOW})


def q6(e: Events, last: int = 10) -> pd.DataFrame:
    """Average selling price by seller (nexmark's definition; Flink does not run its SQL):
    the winning price of each auction is MAX(B.price) of its bids while open, as in q4; a
    seller's auctions are taken in the order they close (expires, then id), and each gives
    one row: the seller and the average winning price of it and the seller's `last` - 1
    auctions closed before it, a BIGINT as Flink's AVG (sum // count). The sink table
    declares seller VARCHAR: the id's digits."""
    won = _bids_while_open(e).groupby(["id", "seller", "expires"]).bid_price.max().rename("final").reset_index()
    won = won.sort_values(["seller", "expires", "id"]).reset_index(drop=True)
    total = won.groupby("seller").final.cumsum()
    before = total.groupby(won.seller).shift(last, fill_value=0)  # the sum of the auctions out of the frame
    count = (won.groupby("seller").cumcount() + 1).clip(upper=last)
    return pd.DataFrame({"seller": won.seller.astype(str), "avg_price": ((total - before) // count).astype("int64")})


def q7(e: Events) -> pd.DataFrame:
    """The bids that carry the highest price of a 10 s window: bid B JOIN (SELECT
    MAX(price) AS maxprice, window_end AS dateTime FROM TUMBLE(bid, dateTime, 10 s) GROUP BY
    window) B1 ON B.price = B1.maxprice WHERE B.dateTime BETWEEN B1.dateTime - 10 s AND
    B1.dateTime. BETWEEN includes both ends, so a bid at a window's end (the first instant
    of the next window) also matches that window's maximum, as in Flink."""
    b = e.bid
    maxes = b.groupby(b.dateTime.dt.floor(WINDOW)).price.max().rename("maxprice").reset_index()
    maxes = pd.DataFrame({"maxprice": maxes.maxprice, "window_end": maxes.dateTime + WINDOW})
    m = b.merge(maxes, left_on="price", right_on="maxprice")
    m = m[(m.dateTime >= m.window_end - WINDOW) & (m.dateTime <= m.window_end)]
    return m[["auction", "bidder", "price", "dateTime", "extra"]]


def q8(e: Events) -> pd.DataFrame:
    """People who registered and opened an auction in the same 10 s window: the distinct
    (id, name, window) of person JOIN the distinct (seller, window) of auction, as
    (id, name, stime = the window's start)."""
    p = e.person.assign(stime=e.person.dateTime.dt.floor(WINDOW))[["id", "name", "stime"]].drop_duplicates()
    a = e.auction.assign(stime=e.auction.dateTime.dt.floor(WINDOW))[["seller", "stime"]].drop_duplicates()
    m = p.merge(a, left_on=["id", "stime"], right_on=["seller", "stime"])
    return m[["id", "name", "stime"]]


def q9(e: Events) -> pd.DataFrame:
    """The winning bid of each auction: among its bids while open, ROW_NUMBER() OVER
    (PARTITION BY A.id ORDER BY B.price DESC, B.dateTime ASC) = 1. The SQL leaves bids of
    the same price and time in no order; here the one first in the bid stream wins (Flink's
    rank keeps the row that came first among equals)."""
    m = _bids_while_open(e).sort_values(["id", "bid_price", "bid_dateTime", "bid_order"],
                                        ascending=[True, False, True, True])
    m = m.drop_duplicates("id", keep="first")
    return m[["id", "itemName", "description", "initialBid", "reserve", "dateTime", "expires", "seller",
              "category", "extra", "bid_auction", "bid_bidder", "bid_price", "bid_dateTime", "bid_extra"]].rename(
        columns={"bid_auction": "auction", "bid_bidder": "bidder", "bid_price": "price"})


def q10(e: Events) -> pd.DataFrame:
    """SELECT auction, bidder, price, dateTime, extra, DATE_FORMAT(dateTime, 'yyyy-MM-dd'),
    DATE_FORMAT(dateTime, 'HH:mm') FROM bid, as (..., dt, hm), in UTC."""
    b = e.bid
    return b[["auction", "bidder", "price", "dateTime", "extra"]].assign(
        dt=b.dateTime.dt.strftime("%Y-%m-%d"), hm=b.dateTime.dt.strftime("%H:%M"))


def q13(e: Events) -> pd.DataFrame:
    """SELECT B.auction, B.bidder, B.price, B.dateTime, S.value FROM bid B JOIN side_input S
    ON mod(B.auction, 10000) = S.key"""
    if e.side_input is None:
        raise ValueError("q13 needs the side input: load(directory, side_input=path)")
    m = e.bid.assign(key=e.bid.auction % 10000).merge(e.side_input, on="key")
    return m[["auction", "bidder", "price", "dateTime", "value"]]


_PRICE_LEVELS = {"1": lambda p: p < 10_000, "2": lambda p: (p >= 10_000) & (p < 1_000_000),
                 "3": lambda p: p >= 1_000_000}


def _level_counts(bids: pd.DataFrame, keys: list[str], of: str, distinct: str | None = None) -> pd.DataFrame:
    """total_<of>, rank1_<of> .. rank3_<of> per group of `keys`: the count of the group's
    bids (of distinct values of the column `distinct`, if given), and of its bids at each
    price level (nexmark-flink's filtered aggregates); 0 where a level has no bid."""
    groups = bids.groupby(keys).size().index

    def count(rows: pd.DataFrame) -> pd.Series:
        by = rows.groupby(keys)
        counted = by.size() if distinct is None else by[distinct].nunique()
        return counted.reindex(groups, fill_value=0).astype("int64")

    return pd.DataFrame({f"total_{of}": count(bids),
                         **{f"rank{n}_{of}": count(bids[level(bids.price)]) for n, level in _PRICE_LEVELS.items()}})


def _bid_stats(e: Events, keys: list[str]) -> pd.DataFrame:
    b = e.bid.assign(day=e.bid.dateTime.dt.strftime("%Y-%m-%d"), minute=e.bid.dateTime.dt.strftime("%H:%M"))
    parts = [_level_counts(b, keys, "bids"), _level_counts(b, keys, "bidders", distinct="bidder"),
             _level_counts(b, keys, "auctions", distinct="auction")]
    if "channel" in keys:
        parts.insert(0, b.groupby(keys).minute.max().rename("minute").to_frame())
    return pd.concat(parts, axis=1).reset_index()


def q15(e: Events) -> pd.DataFrame:
    """Per day: count(*), count(DISTINCT bidder), count(DISTINCT auction), each over all
    bids and with FILTER (WHERE <price level>) for the three levels; the day in UTC."""
    return _bid_stats(e, ["day"])


def q16(e: Events) -> pd.DataFrame:
    """q15 per channel and day, with max(DATE_FORMAT(dateTime, 'HH:mm')) AS minute."""
    return _bid_stats(e, ["channel", "day"])


def q17(e: Events) -> pd.DataFrame:
    """Per auction and day: count(*) with the three price-level filters, min, max, avg
    (a BIGINT in Flink: sum // count) and sum of price."""
    b = e.bid.assign(day=e.bid.dateTime.dt.strftime("%Y-%m-%d"))
    counts = _level_counts(b, ["auction", "day"], "bids")
    price = b.groupby(["auction", "day"]).price
    stats = pd.DataFrame({"min_price": price.min(), "max_price": price.max(),
                          "avg_price": price.sum() // price.count(), "sum_price": price.sum()})
    return pd.concat([counts, stats], axis=1).reset_index()


def _time_of_day(hour: int) -> str:
    if 8 <= hour <= 18:
        return "dayTime"
    if hour <= 6 or hour >= 20:
        return "nightTime"
    return "otherTime"


def q14(e: Events) -> pd.DataFrame:
    """Bids with 1 000 000 < 0.908 * price < 50 000 000, with 0.908 * price, the time of day
    of their hour (UTC), and count_char(extra, 'c'): how often 'c' occurs in extra."""
    b = e.bid[(e.bid.price * 908 > 1_000_000_000) & (e.bid.price * 908 < 50_000_000_000)]
    return pd.DataFrame({"auction": b.auction, "bidder": b.bidder, "price": _euros(b.price),
                         "bidTimeType": b.dateTime.dt.hour.map(_time_of_day), "dateTime": b.dateTime,
                         "extra": b.extra, "c_counts": b.extra.map(lambda s: s.count("c")).astype("int64")})


def q20(e: Events) -> pd.DataFrame:
    """Bids with their auction, auctions of category 10 only: bid B JOIN auction A ON
    B.auction = A.id WHERE A.category = 10, into the sink's columns (bid_dateTime,
    bid_extra, auction_dateTime, auction_extra)."""
    a = e.auction[e.auction.category == 10]
    m = e.bid.merge(a, left_on="auction", right_on="id", suffixes=("_b", "_a"))
    return pd.DataFrame({
        "auction": m.auction, "bidder": m.bidder, "price": m.price, "channel": m.channel, "url": m.url,
        "bid_dateTime": m.dateTime_b, "bid_extra": m.extra_b, "itemName": m.itemName,
        "description": m.description, "initialBid": m.initialBid, "reserve": m.reserve,
        "auction_dateTime": m.dateTime_a, "expires": m.expires, "seller": m.seller, "category": m.category,
        "auction_extra": m.extra_a})


def _channel_id(channel: str, url: str) -> str | None:
    """CASE lower(channel) of the four hot channels, else REGEXP_EXTRACT(url,
    '(&|^)channel_id=([^&]*)', 2): NULL when the URL does not match."""
    hot = HOT_CHANNEL_IDS.get(channel.lower())
    if hot is not None:
        return hot
    found = CHANNEL_ID.search(url)
    return found.group(2) if found else None


def q21(e: Events) -> pd.DataFrame:
    """Bids whose channel has an id (a hot channel's, or `channel_id=` in the URL), with it."""
    b = e.bid.assign(channel_id=[_channel_id(c, u) for c, u in zip(e.bid.channel, e.bid.url)])
    b = b[b.channel_id.notna()]
    return b[["auction", "bidder", "price", "channel", "channel_id"]]


BID_COLUMNS = ["auction", "bidder", "price", "channel", "url", "dateTime", "extra"]


def _first_rows(frame: pd.DataFrame, by: list[str], order: str, descending: bool, n: int) -> pd.DataFrame:
    """ROW_NUMBER() OVER (PARTITION BY `by` ORDER BY `order`) <= n, its ties broken by the
    other columns in table order, ascending, with the row number as `rank_number`."""
    ties = [c for c in frame.columns if c != order]
    ranked = frame.sort_values([order, *ties], ascending=[not descending, *[True] * len(ties)], kind="stable")
    ranked = ranked.assign(rank_number=ranked.groupby(by).cumcount() + 1)
    return ranked[ranked.rank_number <= n]


def q18(e: Events) -> pd.DataFrame:
    """Each bidder's last bid on each auction: ROW_NUMBER() OVER (PARTITION BY bidder,
    auction ORDER BY dateTime DESC) <= 1."""
    return _first_rows(e.bid[BID_COLUMNS], ["bidder", "auction"], "dateTime", True, 1)[BID_COLUMNS]


def q19(e: Events) -> pd.DataFrame:
    """Each auction's ten highest bids: ROW_NUMBER() OVER (PARTITION BY auction ORDER BY
    price DESC) <= 10, with rank_number."""
    return _first_rows(e.bid[BID_COLUMNS], ["auction"], "price", True, 10)[[*BID_COLUMNS, "rank_number"]]


QUERIES: dict[str, Callable[[Events], pd.DataFrame]] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q6": q6, "q7": q7, "q8": q8, "q9": q9, "q10": q10,
    "q11": q11, "q12": q12, "q13": q13, "q14": q14, "q15": q15, "q16": q16, "q17": q17, "q18": q18, "q19": q19,
    "q20": q20, "q21": q21,
}
