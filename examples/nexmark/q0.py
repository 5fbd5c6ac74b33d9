"""Nexmark q0, pass-through: every bid, unchanged.

    sparkpoint run examples/nexmark/q0.py      # input and output: docs/nexmark.md

nexmark-flink: SELECT auction, bidder, price, dateTime, extra FROM bid
"""

from sparkpoint import Pipeline
from sparkpoint.connectors.nexmark_io import EVENT_TIME, WATERMARK_DELAY, nexmark_input, nexmark_output

pipeline = (
    Pipeline("nexmark-q0")
    .source(nexmark_input("bid"))
    .watermark(EVENT_TIME, WATERMARK_DELAY)
    .transform(lambda bids: bids.select("auction", "bidder", "price", "dateTime", "extra"))
    .sink(nexmark_output("q0"))
)
