"""Nexmark q18, last bid: the latest bid of each bidder on each auction.

    sparkpoint run examples/nexmark/q18.py      # input and output: docs/nexmark.md

nexmark-flink:
    SELECT auction, bidder, price, channel, url, dateTime, extra
    FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY dateTime DESC)
          AS rank_number FROM bid)
    WHERE rank_number <= 1

`TopN` of 1 per (bidder, auction) by `dateTime`, latest first. As in Flink the result is
an updating one: in every epoch in which a pair gets a later bid, one row with it. The
latest row of a pair is its result.
"""

from sparkpoint import Pipeline, TopN
from sparkpoint.connectors.nexmark_io import nexmark_input, nexmark_output

COLUMNS = ["auction", "bidder", "price", "channel", "url", "dateTime", "extra"]

pipeline = Pipeline("nexmark-q18")
(pipeline.read(nexmark_input("bid"))
 .transform(lambda bids: bids.select(*COLUMNS))
 .stateful(TopN("last-bid", ["bidder", "auction"], [("dateTime", "desc")], 1))
 .map_output(lambda rows: rows.select(COLUMNS))
 .sink(nexmark_output("q18")))
