"""Nexmark q9, winning bids: each auction with the bid that won it, the highest bid
placed while it was open (of equal prices, the earliest).

    sparkpoint run examples/nexmark/q9.py      # input and output: docs/nexmark.md

nexmark-flink:
    SELECT id, itemName, description, initialBid, reserve, dateTime, expires, seller,
           category, extra, auction, bidder, price, bid_dateTime, bid_extra
    FROM (SELECT A.*, B.auction, B.bidder, B.price, B.dateTime AS bid_dateTime, B.extra AS bid_extra,
                 ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.dateTime ASC) AS rownum
          FROM auction A, bid B
          WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires)
    WHERE rownum <= 1

Two stateful steps in a row:
  1. the join: `StreamJoin` of auctions and bids by auction id, then the rows whose bid
     lies within [dateTime, expires] of its auction. This is Flink's plan too: `expires`
     is a plain column, not a time bound a fixed interval join could use.
  2. the winner (`WinningBid`): per auction, the best bid so far in state and an
     event-time timer at `expires`. When the watermark passes `expires` no bid that
     counts can still come (every stream is read in event-time order and the watermark
     trails it by 4 s), so the winner is emitted once and the auction's state cleared;
     at the end of input every auction still open is emitted. Flink emits the running
     winner as updates; the last of them is this row.
Of bids with the same price and time, the one the step saw first wins, as Flink's rank
keeps the first of equal rows.
"""

import pandas as pd
import pyarrow.compute as pc

from sparkpoint import Pipeline, ProcessorOperator, StatefulProcessor, StreamJoin
from sparkpoint.connectors.nexmark_io import EVENT_TIME, WATERMARK_DELAY, nexmark_input, nexmark_output

WINNER = ("id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, "
          "dateTime TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra STRING, "
          "auction BIGINT, bidder BIGINT, price BIGINT, bid_dateTime TIMESTAMP, bid_extra STRING")
COLUMNS = [field.split()[0] for field in WINNER.split(", ")]
PRICE, BID_TIME = COLUMNS.index("price"), COLUMNS.index("bid_dateTime")


def while_open(pairs):
    """The (auction, bid) pairs whose bid came while the auction was open, ends included."""
    bid_time = pairs.column("bid_dateTime")
    return pairs.filter(pc.and_(pc.greater_equal(bid_time, pairs.column("dateTime")),
                                pc.less_equal(bid_time, pairs.column("expires"))))


def beats(bid, held) -> bool:
    """A higher price wins; of equal prices, the earlier bid; of equal times, the one held."""
    if bid["price"] != held[PRICE]:
        return bid["price"] > held[PRICE]
    return bid["bid_dateTime"] < held[BID_TIME]


class WinningBid(StatefulProcessor):
    def init(self, handle):
        self.handle = handle
        self.best = handle.getValueState("best", WINNER)

    def handle_input_rows(self, key, rows, timer_values):
        top = rows.sort_values(["price", "bid_dateTime"], ascending=[False, True], kind="stable").iloc[0]
        held = self.best.get()
        if held is None:
            self.handle.registerTimer(top["expires"])
        if held is None or beats(top, held):
            self.best.update(top[COLUMNS])
        return ()

    def handle_expired_timer(self, key, timer_values, expired_timer_info):
        held = self.best.get()
        self.best.clear()
        if held is not None:
            yield pd.DataFrame([held], columns=COLUMNS)


pipeline = Pipeline("nexmark-q9")
auctions = pipeline.read(nexmark_input("auction")).watermark(EVENT_TIME, WATERMARK_DELAY)
bids = (pipeline.read(nexmark_input("bid")).watermark(EVENT_TIME, WATERMARK_DELAY)
        .transform(lambda b: b.select("auction", "bidder", "price", b["dateTime"].alias("bid_dateTime"),
                                      b["extra"].alias("bid_extra"))))
(auctions.join(bids, StreamJoin("auction-bids", left_on="id", right_on="auction"))
 .map_output(while_open)
 .stateful(ProcessorOperator("winning-bid", WinningBid, ["id"], WINNER, time_mode="eventtime"))
 .sink(nexmark_output("q9")))
