"""Nexmark q1, currency conversion: each bid's price from dollars to euros.

    sparkpoint run examples/nexmark/q1.py      # input and output: docs/nexmark.md

nexmark-flink: SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid,
into a DECIMAL(23, 3) price: the product is exact, as in Flink SQL.
"""

from decimal import Decimal

from pyspark.sql import functions as F

from sparkpoint import Pipeline
from sparkpoint.connectors.nexmark_io import EVENT_TIME, WATERMARK_DELAY, nexmark_input, nexmark_output


def in_euros(bids):
    euros = (F.lit(Decimal("0.908")) * F.col("price")).cast("decimal(23,3)")
    return bids.select("auction", "bidder", euros.alias("price"), "dateTime", "extra")


pipeline = (
    Pipeline("nexmark-q1")
    .source(nexmark_input("bid"))
    .watermark(EVENT_TIME, WATERMARK_DELAY)
    .transform(in_euros)
    .sink(nexmark_output("q1"))
)
