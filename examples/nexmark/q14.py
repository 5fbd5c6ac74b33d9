"""Nexmark q14, calculation: bids in a price band, with the time of day and a count of
one character in `extra` (a user-defined function).

    sparkpoint run examples/nexmark/q14.py     # input and output: docs/nexmark.md

nexmark-flink:
    SELECT auction, bidder, 0.908 * price AS price,
           CASE WHEN HOUR(dateTime) >= 8 AND HOUR(dateTime) <= 18 THEN 'dayTime'
                WHEN HOUR(dateTime) <= 6 OR HOUR(dateTime) >= 20 THEN 'nightTime'
                ELSE 'otherTime' END AS bidTimeType,
           dateTime, extra, count_char(extra, 'c') AS c_counts
    FROM bid WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000
The price is an exact DECIMAL(23, 3); the hour is UTC's, as the generator's times are.
count_char is a vectorized pandas UDF, as nexmark-flink's is a Java UDF.
"""

from decimal import Decimal

import pandas as pd
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf
from pyspark.sql.types import LongType

from sparkpoint import Pipeline
from sparkpoint.connectors.nexmark_io import EVENT_TIME, WATERMARK_DELAY, nexmark_input, nexmark_output


# A type object, not the DDL string "bigint": parsing DDL needs a live SparkSession, and
# `sparkpoint run` loads this file before Spark starts.
@pandas_udf(LongType())
def count_char(text: pd.Series, char: pd.Series) -> pd.Series:
    """How often `char`'s first character occurs in `text` (0 for a null text)."""
    return pd.Series([s.count(c[0]) if isinstance(s, str) else 0 for s, c in zip(text, char)], dtype="int64")


def priced_by_time_of_day(bids):
    euros = (F.lit(Decimal("0.908")) * F.col("price")).cast("decimal(23,3)")
    hour = F.floor(F.unix_seconds("dateTime") / 3600) % 24  # UTC's hour in any session zone
    time_type = (F.when((hour >= 8) & (hour <= 18), "dayTime")
                 .when((hour <= 6) | (hour >= 20), "nightTime")
                 .otherwise("otherTime"))
    return (bids.where((euros > 1_000_000) & (euros < 50_000_000))
            .select("auction", "bidder", euros.alias("price"), time_type.alias("bidTimeType"), "dateTime", "extra",
                    count_char(F.col("extra"), F.lit("c")).alias("c_counts")))


pipeline = (
    Pipeline("nexmark-q14")
    .source(nexmark_input("bid"))
    .watermark(EVENT_TIME, WATERMARK_DELAY)
    .transform(priced_by_time_of_day)
    .sink(nexmark_output("q14"))
)
