"""Nexmark q2, selection: the bids on every 123rd auction.

    sparkpoint run examples/nexmark/q2.py      # input and output: docs/nexmark.md

nexmark-flink: SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0
"""

from sparkpoint import Pipeline
from sparkpoint.connectors.nexmark_io import nexmark_input, nexmark_output

pipeline = (
    Pipeline("nexmark-q2")
    # No watermark: the output has no event time, and no step here waits for one.
    .source(nexmark_input("bid"))
    .transform(lambda bids: bids.where("auction % 123 = 0").select("auction", "price"))
    .sink(nexmark_output("q2"))
)
