"""Nexmark q16, channel statistics per day: q15's counts per channel and day, with the
latest minute of the day that had a bid.

    sparkpoint run examples/nexmark/q16.py     # input and output: docs/nexmark.md

nexmark-flink:
    SELECT channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS `day`,
        max(DATE_FORMAT(dateTime, 'HH:mm')) AS `minute`,
        count(*) AS total_bids, count(*) filter (where price < 10000) AS rank1_bids, ...
        count(distinct bidder) ..., count(distinct auction) ...
    FROM bid GROUP BY channel, DATE_FORMAT(dateTime, 'yyyy-MM-dd')

One `KeyedAggregate` keyed by (channel, day). `max(date_format(...))` is an aggregate
over an expression that Spark evaluates per row. An updating result, as q15's: the
latest row of a channel and day is its result. Day and minute are UTC's (as in q10.py).
"""

from pyspark.sql import functions as F

from sparkpoint import KeyedAggregate, Pipeline
from sparkpoint.connectors.nexmark_io import nexmark_input, nexmark_output

RANKS = {"1": "price < 10000", "2": "price >= 10000 and price < 1000000", "3": "price >= 1000000"}


def price_level_counts(of: str, counted: str) -> list[str]:
    return [f"{counted} AS total_{of}",
            *[f"{counted} FILTER (WHERE {cond}) AS rank{n}_{of}" for n, cond in RANKS.items()]]


AGGREGATES = ["max(date_format(utc, 'HH:mm')) AS minute",
              *price_level_counts("bids", "count(*)"), *price_level_counts("bidders", "count(DISTINCT bidder)"),
              *price_level_counts("auctions", "count(DISTINCT auction)")]


def with_day(bids):
    utc = F.to_utc_timestamp("dateTime", F.current_timezone())
    return bids.select("channel", F.date_format(utc, "yyyy-MM-dd").alias("day"), utc.alias("utc"),
                       "bidder", "auction", "price")


pipeline = Pipeline("nexmark-q16")
(pipeline.read(nexmark_input("bid"))
 .transform(with_day)
 .stateful(KeyedAggregate("channel-stats", ["channel", "day"], aggs=AGGREGATES))
 .sink(nexmark_output("q16")))
