"""Nexmark q17, auction statistics per day: bids per auction and day, at each level of
price, with the lowest, highest, average and total price.

    sparkpoint run examples/nexmark/q17.py     # input and output: docs/nexmark.md

nexmark-flink:
    SELECT auction, DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS `day`,
         count(*) AS total_bids, count(*) filter (where price < 10000) AS rank1_bids, ...
         min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price,
         sum(price) AS sum_price
    FROM bid GROUP BY auction, DATE_FORMAT(dateTime, 'yyyy-MM-dd')

One `KeyedAggregate` keyed by (auction, day); every aggregate is splittable, so state
holds a few numbers per auction and day. Flink's AVG of a BIGINT is a BIGINT (the sum
divided by the count, truncated): Spark's avg is a DOUBLE, cast to BIGINT after. An
updating result: the latest row of an auction and day is its result.
"""

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F

from sparkpoint import KeyedAggregate, Pipeline
from sparkpoint.connectors.nexmark_io import nexmark_input, nexmark_output

AGGREGATES = [
    "count(*) AS total_bids",
    "count(*) FILTER (WHERE price < 10000) AS rank1_bids",
    "count(*) FILTER (WHERE price >= 10000 and price < 1000000) AS rank2_bids",
    "count(*) FILTER (WHERE price >= 1000000) AS rank3_bids",
    "min(price) AS min_price", "max(price) AS max_price", "sum(price) AS sum_price", "count(price) AS priced_bids",
]
COLUMNS = ["auction", "day", "total_bids", "rank1_bids", "rank2_bids", "rank3_bids", "min_price", "max_price",
           "avg_price", "sum_price"]


def with_day(bids):
    utc = F.to_utc_timestamp("dateTime", F.current_timezone())
    return bids.select("auction", F.date_format(utc, "yyyy-MM-dd").alias("day"), "price")


def with_bigint_average(rows: pa.Table) -> pa.Table:
    """avg_price as Flink's AVG of a BIGINT: sum // count (prices are >= 0), exact."""
    avg = pc.divide(rows.column("sum_price"), rows.column("priced_bids"))  # integers: truncated
    return rows.append_column("avg_price", avg.cast(pa.int64())).select(COLUMNS)


pipeline = Pipeline("nexmark-q17")
(pipeline.read(nexmark_input("bid"))
 .transform(with_day)
 .stateful(KeyedAggregate("auction-stats", ["auction", "day"], aggs=AGGREGATES))
 .map_output(with_bigint_average)
 .sink(nexmark_output("q17")))
