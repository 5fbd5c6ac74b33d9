"""Nexmark q5, hot items: the auctions with the most bids in each 10 s window, every 2 s.

    sparkpoint run examples/nexmark/q5.py      # input and output: docs/nexmark.md

nexmark-flink:
    SELECT AuctionBids.auction, AuctionBids.num
    FROM (SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime
          FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
          GROUP BY auction, window_start, window_end) AS AuctionBids
    JOIN (SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
          FROM (<the same counts>) AS CountBids
          GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids
    ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime
       AND AuctionBids.num >= MaxBids.maxn

A `SlidingWindow` counts the bids per auction and window ("final" mode: one row per
auction and window, when the watermark passes the window's end). All the counts of one
window come out in the same epoch (every subtask fires a window at the same watermark),
so a plain PySpark step on each epoch's output finds the windows' highest counts and
keeps the auctions that reach them.
"""

from pyspark.sql import Window
from pyspark.sql import functions as F

from sparkpoint import Pipeline, SlidingWindow
from sparkpoint.connectors.nexmark_io import EVENT_TIME, WATERMARK_DELAY, nexmark_input, nexmark_output


def hottest(counts):
    """The rows of each window whose count is the window's highest (ties: all of them)."""
    per_window = Window.partitionBy("window_start", "window_end")
    return (counts.withColumn("maxn", F.max("num").over(per_window))
            .where(F.col("num") >= F.col("maxn")).select("auction", "num"))


pipeline = Pipeline("nexmark-q5")
(pipeline.read(nexmark_input("bid"))
 .watermark(EVENT_TIME, WATERMARK_DELAY)
 .transform(lambda bids: bids.select("auction", "dateTime"))
 .stateful(SlidingWindow("bids-per-auction", ["auction"], EVENT_TIME, size="10 s", slide="2 s",
                         aggs=["count(*) AS num"]))
 .transform(hottest)
 .sink(nexmark_output("q5")))
