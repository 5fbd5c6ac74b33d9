"""Nexmark q21, add a channel id: the bids whose channel has an id, with that id.

    sparkpoint run examples/nexmark/q21.py     # input and output: docs/nexmark.md

nexmark-flink:
    SELECT auction, bidder, price, channel,
           CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1'
                WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3'
                ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id
    FROM bid
    WHERE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) IS NOT NULL
       OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')
Flink's REGEXP_EXTRACT is NULL when the pattern does not match; Spark's is ''. So the
extraction here is NULL unless the URL matches, which keeps Flink's meaning (a URL with
an empty `channel_id=` still counts, as in Flink).
"""

from pyspark.sql import functions as F

from sparkpoint import Pipeline
from sparkpoint.connectors.nexmark_io import nexmark_input, nexmark_output

CHANNEL_ID = "(&|^)channel_id=([^&]*)"


def with_channel_id(bids):
    channel = F.lower("channel")
    from_url = F.when(F.col("url").rlike(CHANNEL_ID), F.regexp_extract("url", CHANNEL_ID, 2))
    channel_id = (F.when(channel == "apple", "0").when(channel == "google", "1")
                  .when(channel == "facebook", "2").when(channel == "baidu", "3")
                  .otherwise(from_url))
    hot = channel.isin("apple", "google", "facebook", "baidu")
    return (bids.where(from_url.isNotNull() | hot)
            .select("auction", "bidder", "price", "channel", channel_id.alias("channel_id")))


pipeline = (
    Pipeline("nexmark-q21")
    # No watermark: the output has no event time, and no step here waits for one.
    .source(nexmark_input("bid"))
    .transform(with_channel_id)
    .sink(nexmark_output("q21"))
)
