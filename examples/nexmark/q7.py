"""Nexmark q7, highest bid: the bids that carry the highest price of a 10 s window.

    sparkpoint run examples/nexmark/q7.py      # input and output: docs/nexmark.md

nexmark-flink:
    SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra
    FROM bid B
    JOIN (SELECT MAX(price) AS maxprice, window_end AS dateTime
          FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
          GROUP BY window_start, window_end) B1
    ON B.price = B1.maxprice
    WHERE B.dateTime BETWEEN B1.dateTime - INTERVAL '10' SECOND AND B1.dateTime
into the sink columns auction, bidder, price, dateTime, extra.

One custom stateful step (`HighestBids`), keyed by window. `BETWEEN` includes both ends,
so a bid at the first instant of a window also matches the previous window's highest
price: such a bid goes to both windows, marked as at the end of the earlier one, where
it is a candidate but does not count towards the maximum. A window keeps its highest
price and the bids at it, and emits them once, when the watermark reaches its end, when
every bid up to and at its end has come (or at the end of input).

Flink's plan is a window aggregate, then an interval join of the bids with the
maxima. Here one processor does both: the join would keep every bid of a window in its
state, where the processor keeps only the bids at the highest price (docs/nexmark.md).
"""

import pandas as pd
from pyspark.sql import functions as F

from sparkpoint import Pipeline, ProcessorOperator, StatefulProcessor
from sparkpoint.connectors.nexmark_io import EVENT_TIME, WATERMARK_DELAY, nexmark_input, nexmark_output

WINDOW_MS = 10_000
BID = "auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP, extra STRING"
COLUMNS = [field.split()[0] for field in BID.split(", ")]


def by_window(bids):
    """Each bid under the start of its window; a bid at a window's first instant also
    under the previous window's start, with at_end set."""
    ms = F.unix_millis(EVENT_TIME)
    start = ms - F.pmod(ms, F.lit(WINDOW_MS))
    windows = F.array(F.struct(start.alias("window"), F.lit(False).alias("at_end")))
    boundary = F.array(F.struct(start.alias("window"), F.lit(False).alias("at_end")),
                       F.struct((start - WINDOW_MS).alias("window"), F.lit(True).alias("at_end")))
    placed = bids.select(*COLUMNS, F.explode(F.when(F.pmod(ms, F.lit(WINDOW_MS)) == 0, boundary)
                                              .otherwise(windows)).alias("w"))
    return placed.select(*COLUMNS, "w.window", "w.at_end")


class HighestBids(StatefulProcessor):
    def init(self, handle):
        self.handle = handle
        self.highest = handle.getValueState("highest", "price BIGINT")
        self.leaders = handle.getListState("leaders", BID)  # the window's bids at its highest price
        self.at_end = handle.getListState("at_end", BID)    # bids at the window's end instant

    def handle_input_rows(self, key, rows, timer_values):
        if not self.highest.exists() and not self.at_end.exists():
            self.handle.registerTimer(int(key[0]) + WINDOW_MS)
        inside, at_end = rows[~rows["at_end"]], rows[rows["at_end"]]
        self.at_end.appendList(at_end[COLUMNS].itertuples(index=False, name=None))
        if inside.empty:
            return ()
        top = int(inside["price"].max())
        leaders = inside.loc[inside["price"] == top, COLUMNS].itertuples(index=False, name=None)
        held = self.highest.get()
        if held is None or top > held[0]:
            self.highest.update((top,))
            self.leaders.put(leaders)
        elif top == held[0]:
            self.leaders.appendList(leaders)
        return ()

    def handle_expired_timer(self, key, timer_values, expired_timer_info):
        held = self.highest.get()
        winners = list(self.leaders.get()) if held is not None else []
        winners += [bid for bid in self.at_end.get() if held is not None and bid[2] == held[0]]
        self.highest.clear()
        self.leaders.clear()
        self.at_end.clear()
        if winners:
            yield pd.DataFrame(winners, columns=COLUMNS)


pipeline = Pipeline("nexmark-q7")
(pipeline.read(nexmark_input("bid"))
 .watermark(EVENT_TIME, WATERMARK_DELAY)
 .transform(by_window)
 .stateful(ProcessorOperator("highest-bids", HighestBids, ["window"], BID, time_mode="eventtime"))
 .sink(nexmark_output("q7")))
