"""Nexmark q10, log to a file system: every bid with its day and minute.

    sparkpoint run examples/nexmark/q10.py     # input and output: docs/nexmark.md

nexmark-flink: SELECT auction, bidder, price, dateTime, extra,
DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS dt, DATE_FORMAT(dateTime, 'HH:mm') AS hm FROM bid.
Flink partitions its files by (dt, hm); here they are plain columns of the output
(ParquetSink commits per epoch, not per partition). The day and minute are those of UTC
whatever the session's time zone, as the generator's times are UTC.
"""

from pyspark.sql import functions as F

from sparkpoint import Pipeline
from sparkpoint.connectors.nexmark_io import EVENT_TIME, WATERMARK_DELAY, nexmark_input, nexmark_output


def with_day_and_minute(bids):
    # The session zone's wall clock shifted to UTC's, so date_format shows UTC's.
    utc = F.to_utc_timestamp("dateTime", F.current_timezone())
    return bids.select("auction", "bidder", "price", "dateTime", "extra",
                       F.date_format(utc, "yyyy-MM-dd").alias("dt"), F.date_format(utc, "HH:mm").alias("hm"))


pipeline = (
    Pipeline("nexmark-q10")
    .source(nexmark_input("bid"))
    .watermark(EVENT_TIME, WATERMARK_DELAY)
    .transform(with_day_and_minute)
    .sink(nexmark_output("q10"))
)
