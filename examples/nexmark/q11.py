"""Nexmark q11, user sessions: how many bids each bidder made in each session of
activity, sessions ending after 10 s without a bid.

    sparkpoint run examples/nexmark/q11.py      # input and output: docs/nexmark.md

nexmark-flink:
    SELECT B.bidder, count(*) AS bid_count,
           SESSION_START(B.dateTime, INTERVAL '10' SECOND) AS starttime,
           SESSION_END(B.dateTime, INTERVAL '10' SECOND) AS endtime
    FROM bid B
    GROUP BY B.bidder, SESSION(B.dateTime, INTERVAL '10' SECOND)

A `SessionWindow` per bidder with a 10 s gap ("final" mode): a session starts at its
first bid and ends 10 s after its last, bids whose 10 s spans overlap or touch are one
session (Flink's and Spark's rule), and each session is emitted once, when the
watermark reaches its end (or at the end of input). A PySpark step renames the bounds
to the sink's columns. Every stream is in event-time order and the watermark trails it
by 4 s, so no bid comes late and the `late` column is always false; it is dropped.
"""

from pyspark.sql import functions as F

from sparkpoint import Pipeline, SessionWindow
from sparkpoint.connectors.nexmark_io import EVENT_TIME, WATERMARK_DELAY, nexmark_input, nexmark_output

pipeline = Pipeline("nexmark-q11")
(pipeline.read(nexmark_input("bid"))
 .watermark(EVENT_TIME, WATERMARK_DELAY)
 .transform(lambda bids: bids.select("bidder", "dateTime"))
 .stateful(SessionWindow("sessions-per-bidder", ["bidder"], EVENT_TIME, gap="10 s", aggs=["count(*) AS bid_count"]))
 .transform(lambda sessions: sessions.select("bidder", "bid_count", F.col("window_start").alias("starttime"),
                                             F.col("window_end").alias("endtime")))
 .sink(nexmark_output("q11")))
