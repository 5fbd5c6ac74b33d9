"""Nexmark q20, expand bid with auction: each bid with the whole row of its auction,
auctions of category 10 only.

    sparkpoint run examples/nexmark/q20.py     # input and output: docs/nexmark.md

nexmark-flink:
    SELECT auction, bidder, price, channel, url, B.dateTime, B.extra,
           itemName, description, initialBid, reserve, A.dateTime, expires, seller, category, A.extra
    FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id
    WHERE A.category = 10
into the sink columns bid_dateTime, bid_extra, auction_dateTime and auction_extra.

A regular join (`StreamJoin`), as in Flink. An interval join would not be the same
query: the generator lets a bid name an auction that opens later, and bids go on after
an auction expires, and how far apart in event time those are depends on the event rate.
"""

from sparkpoint import Pipeline, StreamJoin
from sparkpoint.connectors.nexmark_io import nexmark_input, nexmark_output

pipeline = Pipeline("nexmark-q20")
bids = pipeline.read(nexmark_input("bid")).transform(
    lambda b: b.withColumnRenamed("dateTime", "bid_dateTime").withColumnRenamed("extra", "bid_extra"))
auctions = pipeline.read(nexmark_input("auction")).transform(
    lambda a: a.where("category = 10")
    .withColumnRenamed("dateTime", "auction_dateTime").withColumnRenamed("extra", "auction_extra"))
(bids.join(auctions, StreamJoin("bid-auction", left_on="auction", right_on="id"))
 # The joined rows are the bid's columns, then the auction's, whose `id` is `auction`.
 .map_output(lambda rows: rows.drop_columns(["id"]))
 .sink(nexmark_output("q20")))
