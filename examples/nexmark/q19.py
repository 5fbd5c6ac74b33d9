"""Nexmark q19, auction top-10 price: the ten highest bids of each auction.

    sparkpoint run examples/nexmark/q19.py      # input and output: docs/nexmark.md

nexmark-flink:
    SELECT * FROM
    (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number
     FROM bid)
    WHERE rank_number <= 10

`TopN` of 10 per auction by price, highest first. As in Flink the result is an updating
one: in every epoch in which an auction's top 10 changes, its rows ranked 1 to 10. The
latest row of an (auction, rank_number) is its result.
"""

from sparkpoint import Pipeline, TopN
from sparkpoint.connectors.nexmark_io import nexmark_input, nexmark_output

pipeline = Pipeline("nexmark-q19")
(pipeline.read(nexmark_input("bid"))
 .transform(lambda bids: bids.select("auction", "bidder", "price", "channel", "url", "dateTime", "extra"))
 .stateful(TopN("top-10", ["auction"], [("price", "desc")], 10, rank_column="rank_number"))
 .sink(nexmark_output("q19")))
