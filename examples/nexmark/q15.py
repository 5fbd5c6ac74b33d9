"""Nexmark q15, bidding statistics per day: how many bids, bidders and auctions at
each level of price.

    sparkpoint run examples/nexmark/q15.py     # input and output: docs/nexmark.md

nexmark-flink:
    SELECT DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS `day`,
         count(*) AS total_bids,
         count(*) filter (where price < 10000) AS rank1_bids, ...
         count(distinct bidder) AS total_bidders,
         count(distinct bidder) filter (where price < 10000) AS rank1_bidders, ...
         count(distinct auction) AS total_auctions, ...
    FROM bid GROUP BY DATE_FORMAT(dateTime, 'yyyy-MM-dd')

One `KeyedAggregate` keyed by the day, with Flink's aggregates written as Spark SQL.
The counts are pre-aggregated by Spark each epoch; the distinct counts keep each day's
set of bidders and auctions (per price level) in state. As in Flink the result is an
updating one: in every epoch, one row per day that got bids. The latest row of a day is
its result. The day is UTC's whatever the session's time zone (as in q10.py).
"""

from pyspark.sql import functions as F

from sparkpoint import KeyedAggregate, Pipeline
from sparkpoint.connectors.nexmark_io import nexmark_input, nexmark_output

RANKS = {"1": "price < 10000", "2": "price >= 10000 and price < 1000000", "3": "price >= 1000000"}


def price_level_counts(of: str, counted: str) -> list[str]:
    """total_<of> and rank<N>_<of>: `counted` over all bids, and over each price level."""
    return [f"{counted} AS total_{of}",
            *[f"{counted} FILTER (WHERE {cond}) AS rank{n}_{of}" for n, cond in RANKS.items()]]


AGGREGATES = [*price_level_counts("bids", "count(*)"), *price_level_counts("bidders", "count(DISTINCT bidder)"),
              *price_level_counts("auctions", "count(DISTINCT auction)")]


def with_day(bids):
    utc = F.to_utc_timestamp("dateTime", F.current_timezone())
    return bids.select(F.date_format(utc, "yyyy-MM-dd").alias("day"), "bidder", "auction", "price")


pipeline = Pipeline("nexmark-q15")
(pipeline.read(nexmark_input("bid"))
 .transform(with_day)
 .stateful(KeyedAggregate("bid-stats", ["day"], aggs=AGGREGATES))
 .sink(nexmark_output("q15")))
