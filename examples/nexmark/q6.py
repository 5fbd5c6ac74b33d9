"""Nexmark q6, average selling price by seller: for each seller, the average winning
price of their last 10 closed auctions, given again each time an auction of theirs
closes.

    sparkpoint run examples/nexmark/q6.py      # input and output: docs/nexmark.md

nexmark-flink (which marks it as not supported: its OVER window cannot consume the
updates of the winning-bid rank):
    SELECT Q.seller,
           AVG(Q.price) OVER (PARTITION BY Q.seller ORDER BY Q.dateTime
                              ROWS BETWEEN 10 PRECEDING AND CURRENT ROW)
    FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY A.id, A.seller ORDER BY B.price DESC) AS rownum
          FROM (SELECT A.id, A.seller, B.price, B.dateTime
                FROM auction AS A, bid AS B
                WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires)
          WHERE rownum <= 1) AS Q
into the sink columns seller and avg_price.

Three stateful steps in a row, the first two those of q4:
  1. the join of auctions and bids by auction id (`StreamJoin`), then the pairs whose
     bid came while the auction was open (q9.py says why a regular join);
  2. the winning price per auction (`WinningPrice`): the highest so far in state, and an
     event-time timer at `expires` that emits (seller, final, expires, id) once, when the
     watermark passes it and the auction is closed (or at the end of input);
  3. the average per seller (`AveragePrice`): the winning prices of the seller's last 10
     closed auctions in list state; for each auction that closes, in the order they
     close (by `expires`, then id), one row with the average of it and the up to 9 that
     closed before it, as Flink's AVG of a BIGINT: the sum divided by the count,
     truncated. Auctions close in that order across epochs too: the watermark fires
     every auction that expires before it in one epoch, and those after it later.

What differs from the SQL, and why:
  - "Last 10" is nexmark's definition of the query (and its Beam implementation's, which
    keeps 10); the SQL's frame, 10 PRECEDING AND CURRENT ROW, would hold 11 rows.
  - The SQL orders a seller's auctions by the winning bid's time; here they are ordered
    by when they close. An auction is known to be won only when it closes, and one that
    closes later may hold an earlier winning bid, so ordering by bid time would change
    averages already given. Closing order is nexmark's "last 10 closed auctions".
  - The sink table declares `seller VARCHAR`; the query writes the seller's BIGINT id
    there, so it comes out as its decimal digits.
  - An auction without a bid while it was open has no winning price and no row, as the
    inner join gives.
"""

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint import Pipeline, ProcessorOperator, StatefulProcessor, StreamJoin
from sparkpoint.connectors.nexmark_io import EVENT_TIME, WATERMARK_DELAY, nexmark_input, nexmark_output

LAST = 10
CLOSED = "seller BIGINT, final BIGINT, expires TIMESTAMP, id BIGINT"
AVERAGE = "seller BIGINT, avg_price BIGINT"


def while_open(pairs):
    """The (auction, bid) pairs whose bid came while the auction was open, ends included."""
    bid_time = pairs.column("bid_dateTime")
    return pairs.filter(pc.and_(pc.greater_equal(bid_time, pairs.column("dateTime")),
                                pc.less_equal(bid_time, pairs.column("expires"))))


class WinningPrice(StatefulProcessor):
    """Per auction: its highest price while open, emitted once when it closes."""

    def init(self, handle):
        self.handle = handle
        self.best = handle.getValueState("best", CLOSED)

    def handle_input_rows(self, key, rows, timer_values):
        held = self.best.get()
        first = rows.iloc[0]
        if held is None:
            self.handle.registerTimer(first["expires"])
        final = int(rows["price"].max())
        if held is None or final > held[1]:
            self.best.update((int(first["seller"]), final, first["expires"], int(key[0])))
        return ()

    def handle_expired_timer(self, key, timer_values, expired_timer_info):
        held = self.best.get()
        self.best.clear()
        if held is not None:
            yield pd.DataFrame([held], columns=["seller", "final", "expires", "id"])


class AveragePrice(StatefulProcessor):
    """Per seller: the winning prices of the last `LAST` closed auctions, and their average
    each time one closes."""

    def init(self, handle):
        self.prices = handle.getListState("last_prices", "final BIGINT")

    def handle_input_rows(self, key, rows, timer_values):
        prices = [p for (p,) in self.prices.get()]
        averages = []
        for final in rows.sort_values(["expires", "id"], kind="stable")["final"]:
            prices = [*prices, int(final)][-LAST:]
            averages.append(sum(prices) // len(prices))
        self.prices.put([(p,) for p in prices])
        yield pd.DataFrame({"seller": key[0], "avg_price": averages})


def seller_as_varchar(averages):
    """The sink table's seller VARCHAR: the seller id's decimal digits."""
    return pa.table({"seller": pc.cast(averages.column("seller"), pa.string()),
                     "avg_price": averages.column("avg_price")})


pipeline = Pipeline("nexmark-q6")
auctions = (pipeline.read(nexmark_input("auction")).watermark(EVENT_TIME, WATERMARK_DELAY)
            .transform(lambda a: a.select("id", "seller", "dateTime", "expires")))
bids = (pipeline.read(nexmark_input("bid")).watermark(EVENT_TIME, WATERMARK_DELAY)
        .transform(lambda b: b.select("auction", "price", b["dateTime"].alias("bid_dateTime"))))
(auctions.join(bids, StreamJoin("auction-bids", left_on="id", right_on="auction"))
 .map_output(while_open)
 .stateful(ProcessorOperator("winning-price", WinningPrice, ["id"], CLOSED, time_mode="eventtime"))
 .stateful(ProcessorOperator("average-price", AveragePrice, ["seller"], AVERAGE))
 .map_output(seller_as_varchar)
 .sink(nexmark_output("q6")))
