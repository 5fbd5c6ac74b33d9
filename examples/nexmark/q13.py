"""Nexmark q13, bounded side input join: each bid enriched with a value from a static table.

    sparkpoint run examples/nexmark/q13.py     # input and output: docs/nexmark.md

nexmark-flink: SELECT B.auction, B.bidder, B.price, B.dateTime, S.value FROM bid B
JOIN side_input FOR SYSTEM_TIME AS OF B.p_time AS S ON mod(B.auction, 10000) = S.key.
The side input is nexmark-flink's: a CSV file of keys 0 .. 9999, each with its own digits
as value ($NEXMARK_SIDE_INPUT, else side_input.csv beside the input, written on first use).
A stream-static join is a plain PySpark step: the static DataFrame is read in the step.
"""

from pyspark.sql import functions as F

from sparkpoint import Pipeline
from sparkpoint.connectors.nexmark_io import (EVENT_TIME, WATERMARK_DELAY, nexmark_input, nexmark_output,
                                              side_input_path)

SIDE_INPUT = side_input_path()


def enrich(bids):
    side = bids.sparkSession.read.csv(SIDE_INPUT, schema="key BIGINT, value STRING")
    joined = bids.join(F.broadcast(side), (bids["auction"] % 10000) == side["key"])
    return joined.select(bids["auction"], bids["bidder"], bids["price"], bids["dateTime"], side["value"])


pipeline = (
    Pipeline("nexmark-q13")
    .source(nexmark_input("bid"))
    .watermark(EVENT_TIME, WATERMARK_DELAY)
    .transform(enrich)
    .sink(nexmark_output("q13"))
)
