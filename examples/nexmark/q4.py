"""Nexmark q4, average price per category: the average winning price of the auctions
of each category.

    sparkpoint run examples/nexmark/q4.py      # input and output: docs/nexmark.md

nexmark-flink:
    SELECT Q.category, AVG(Q.final)
    FROM (SELECT MAX(B.price) AS final, A.category
          FROM auction A, bid B
          WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
          GROUP BY A.id, A.category) Q
    GROUP BY Q.category
into the sink columns id (the category) and final.

Three stateful steps in a row:
  1. the join of auctions and bids by auction id (`StreamJoin`), then the pairs whose
     bid came while the auction was open: as in q9.py, which says why a regular join;
  2. the winning price per auction (`WinningPrice`): the highest so far in state, and an
     event-time timer at `expires` that emits (category, final) once, when the watermark
     passes it and no bid that counts can come any more (or at the end of input);
  3. the average per category (`KeyedAggregate` of count and sum), as Flink's
     AVG of a BIGINT: the sum divided by the count, truncated, a BIGINT.
The output is, as Flink's, an updating result: in every epoch in which a category's
average changes, one row with the new one. The latest row of a category is its result.
"""

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint import KeyedAggregate, Pipeline, ProcessorOperator, StatefulProcessor, StreamJoin
from sparkpoint.connectors.nexmark_io import EVENT_TIME, WATERMARK_DELAY, nexmark_input, nexmark_output

WINNING_PRICE = "category BIGINT, final BIGINT"


def while_open(pairs):
    """The (auction, bid) pairs whose bid came while the auction was open, ends included."""
    bid_time = pairs.column("bid_dateTime")
    return pairs.filter(pc.and_(pc.greater_equal(bid_time, pairs.column("dateTime")),
                                pc.less_equal(bid_time, pairs.column("expires"))))


class WinningPrice(StatefulProcessor):
    def init(self, handle):
        self.handle = handle
        self.best = handle.getValueState("best", WINNING_PRICE)

    def handle_input_rows(self, key, rows, timer_values):
        held = self.best.get()
        if held is None:
            self.handle.registerTimer(rows["expires"].iloc[0])
        final = int(rows["price"].max())
        if held is None or final > held[1]:
            self.best.update((int(rows["category"].iloc[0]), final))
        return ()

    def handle_expired_timer(self, key, timer_values, expired_timer_info):
        held = self.best.get()
        self.best.clear()
        if held is not None:
            yield pd.DataFrame([held], columns=["category", "final"])


def average(totals):
    """KeyedAggregate's (category, count, sum) as the sink's (id, final)."""
    final = pc.divide(totals.column("sum"), totals.column("count"))  # integers: truncated
    return pa.table({"id": totals.column("category"), "final": final.cast(pa.int64())})


pipeline = Pipeline("nexmark-q4")
auctions = (pipeline.read(nexmark_input("auction")).watermark(EVENT_TIME, WATERMARK_DELAY)
            .transform(lambda a: a.select("id", "dateTime", "expires", "category")))
bids = (pipeline.read(nexmark_input("bid")).watermark(EVENT_TIME, WATERMARK_DELAY)
        .transform(lambda b: b.select("auction", "price", b["dateTime"].alias("bid_dateTime"))))
(auctions.join(bids, StreamJoin("auction-bids", left_on="id", right_on="auction"))
 .map_output(while_open)
 .stateful(ProcessorOperator("winning-price", WinningPrice, ["id"], WINNING_PRICE, time_mode="eventtime"))
 .stateful(KeyedAggregate("average-per-category", ["category"], "final", ["count", "sum"], value_type="bigint"))
 .map_output(average)
 .sink(nexmark_output("q4")))
