"""Nexmark on Spark Structured Streaming (the peer of bench/nexmark.py): each query that Spark SS
can express in DataFrame / SQL form, over the Parquet files `sparkpoint nexmark generate` wrote,
one after the other in one local[2] session (2 shuffle partitions, AQE off, as sparkpoint's).

    python bench/nexmark_spark_ss.py --events N --queries q0,q1,... [--files-per-stream 20]
        [--files-per-epoch 2] [--work /tmp/sparkpoint-bench]

Every stream: `readStream.parquet(DIR/<stream>)` with `maxFilesPerTrigger` = files per epoch (the
batches sparkpoint's epochs read), `withWatermark("dateTime", "4 seconds")`, trigger
`availableNow` (the query ends when the files are read), HDFS-backed state store (the default;
Spark commits its state every batch, so it has no separate checkpoint duration: the RESULT carries
the batch duration p50 / p99 and the state commit time). Output: foreachBatch writing Parquet,
append mode (q17: update mode). Prints one `RESULT {json}` per query; a query Spark SS cannot
express gives `cannot_express` with the reason. Windowed queries (q5, q7, q8, q11) emit only the
windows the watermark closed: Spark SS has no end-of-input watermark, so the last windows stay open
where sparkpoint and Flink fire them at the end of input, so their output lacks those windows' rows
(tests/integration/test_bench_nexmark_spark_ss_rows.py closes them with a later event and finds the
rows of q5, q7 and q8 equal to those of sparkpoint's examples).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from process_tree import PeakRss, tree_cpu_s  # noqa: E402

from sparkpoint.connectors.nexmark_source import DDL  # noqa: E402  (the streams' columns, written once)

HDFS_STORE = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
# Why a query has no Spark SS form (DataFrame / SQL, no arbitrary stateful operator).
CANNOT_EXPRESS = {
    "q4": "MAX per auction over an unbounded stream-stream join, then AVG of it per category: "
          "two chained aggregations over a join without a time bound (no append mode, update mode has no join)",
    "q6": "a ROW_NUMBER / OVER (last 10) window over the winning bids: non-time window functions are "
          "unsupported on streaming DataFrames",
    "q9": "ROW_NUMBER per auction over a stream-stream join: non-time window functions are unsupported "
          "on streaming DataFrames",
    "q12": "a processing-time window (PROCTIME()): Spark SS windows only on a column, and "
           "current_timestamp() is the batch's, not a row's arrival",
    "q15": "count(DISTINCT ...): distinct aggregations are unsupported on streaming DataFrames",
    "q16": "count(DISTINCT ...): distinct aggregations are unsupported on streaming DataFrames",
    "q18": "ROW_NUMBER per (bidder, auction) ordered by time, keeping the last: non-time window functions "
           "are unsupported, dropDuplicates keeps the first row",
    "q19": "ROW_NUMBER per auction (top 10 by price): non-time window functions are unsupported on "
           "streaming DataFrames",
}


def build(query: str, spark, read) -> tuple[Any, str]:
    """(the streaming DataFrame of `query`, output mode); `read(stream)` gives a watermarked stream."""
    from pyspark.sql import functions as F

    if query == "q0":
        return read("bid"), "append"
    if query == "q1":
        return read("bid").selectExpr("auction", "bidder", "CAST(0.908BD * price AS DECIMAL(23,3)) AS price",
                                      "dateTime", "extra"), "append"
    if query == "q2":
        return read("bid").where("auction % 123 = 0").select("auction", "price"), "append"
    if query == "q3":
        a = read("auction").where("category = 10").selectExpr("id AS a_id", "seller")
        p = read("person").where("state IN ('OR', 'ID', 'CA')").select("id", "name", "city", "state")
        return a.join(p, F.expr("seller = id")).select("name", "city", "state", "a_id"), "append"
    if query == "q5":
        # The per-window maximum is taken over the window's counts, chained on the count's window
        # column (the watermark passes from one aggregation to the next), instead of the SQL's
        # self-join of the counts with their maximum: one read of the bids and one count, not two.
        # Spark accepts that self-join too (a join on the window after the two aggregations); it
        # ran 2-3x slower at 200 k events.
        counts = (read("bid").groupBy("auction", F.window("dateTime", "10 seconds", "2 seconds"))
                  .agg(F.count("*").alias("num")))
        return (counts.groupBy("window").agg(F.max("num").alias("maxn"),
                                             F.collect_list(F.struct("auction", "num")).alias("counts"))
                .select("maxn", F.explode("counts").alias("c")).where("c.num >= maxn")
                .select("c.auction", "c.num"), "append")
    if query == "q7":
        # window_time() is the window's last instant (its end - 1 µs), the event time Spark carries
        # from the aggregation into the join, so the join can drop bids the watermark has passed.
        # BETWEEN end - 10 s AND end, as nexmark-flink's SQL: a bid at a window's end (the first
        # instant of the next window) also matches the earlier window's maximum.
        highest = (read("bid").groupBy(F.window("dateTime", "10 seconds")).agg(F.max("price").alias("maxprice"))
                   .select("maxprice", F.window_time("window").alias("last_instant")))
        return (read("bid").join(highest, F.expr(
            "price = maxprice AND dateTime BETWEEN last_instant + INTERVAL 1 MICROSECOND - INTERVAL 10 SECONDS "
            "AND last_instant + INTERVAL 1 MICROSECOND"))
                .select("auction", "bidder", "price", "dateTime", "extra"), "append")
    if query == "q8":
        # Each side grouped by its 10 s window first, as the SQL does (a seller with several
        # auctions in a window counts once), then joined on the window itself.
        people = read("person").groupBy("id", "name", F.window("dateTime", "10 seconds")).agg(F.count("*").alias("n"))
        sellers = (read("auction").groupBy("seller", F.window("dateTime", "10 seconds"))
                   .agg(F.count("*").alias("n")).withColumnRenamed("window", "seller_window"))
        return (people.join(sellers, F.expr("id = seller AND window = seller_window"))
                .select("id", "name", F.col("window.start").alias("stime")), "append")
    if query == "q10":
        return read("bid").selectExpr("auction", "bidder", "price", "dateTime", "extra",
                                      "date_format(dateTime, 'yyyy-MM-dd') AS dt",
                                      "date_format(dateTime, 'HH:mm') AS hm"), "append"
    if query == "q11":
        return (read("bid").groupBy("bidder", F.session_window("dateTime", "10 seconds").alias("s")).count()
                .selectExpr("bidder", "count AS bid_count", "s.start AS starttime", "s.end AS endtime"), "append")
    if query == "q13":
        side = spark.read.schema("key BIGINT, value STRING").csv(os.environ["NEXMARK_SIDE_INPUT"])
        return (read("bid").join(side, F.expr("auction % 10000 = key"))
                .select("auction", "bidder", "price", "dateTime", "value"), "append")
    if query == "q14":
        return (read("bid").where("0.908 * price > 1000000 AND 0.908 * price < 50000000")
                .selectExpr("auction", "bidder", "CAST(0.908BD * price AS DECIMAL(23,3)) AS price",
                            "CASE WHEN hour(dateTime) >= 8 AND hour(dateTime) <= 18 THEN 'dayTime' "
                            "WHEN hour(dateTime) <= 6 OR hour(dateTime) >= 20 THEN 'nightTime' "
                            "ELSE 'otherTime' END AS bidTimeType", "dateTime", "extra",
                            "CAST(length(extra) - length(replace(extra, 'c', '')) AS BIGINT) AS c_counts"),
                "append")
    if query == "q17":
        return (read("bid").withColumn("day", F.date_format("dateTime", "yyyy-MM-dd"))
                .groupBy("auction", "day").agg(
                    F.count("*").alias("total_bids"),
                    F.count(F.when(F.col("price") < 10000, 1)).alias("rank1_bids"),
                    F.count(F.when((F.col("price") >= 10000) & (F.col("price") < 1000000), 1)).alias("rank2_bids"),
                    F.count(F.when(F.col("price") >= 1000000, 1)).alias("rank3_bids"),
                    F.min("price").alias("min_price"), F.max("price").alias("max_price"),
                    F.avg("price").cast("bigint").alias("avg_price"), F.sum("price").alias("sum_price")),
                "update")
    if query == "q20":
        b = read("bid").selectExpr("auction", "bidder", "price", "channel", "url", "dateTime AS bid_dateTime",
                                   "extra AS bid_extra")
        a = read("auction").where("category = 10").selectExpr(
            "id", "itemName", "description", "initialBid", "reserve", "dateTime AS auction_dateTime", "expires",
            "seller", "category", "extra AS auction_extra")
        return b.join(a, F.expr("auction = id")).drop("id"), "append"
    if query == "q21":
        cid = "regexp_extract(url, '(&|^)channel_id=([^&]*)', 2)"
        # Flink's REGEXP_EXTRACT gives NULL on no match where Spark's gives '': keep Flink's meaning.
        flink_cid = f"CASE WHEN url RLIKE '(&|^)channel_id=' THEN {cid} END"
        return (read("bid").where(f"({flink_cid}) IS NOT NULL OR lower(channel) IN "
                                  "('apple', 'google', 'facebook', 'baidu')")
                .selectExpr("auction", "bidder", "price", "channel",
                            "CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1' "
                            "WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3' "
                            f"ELSE {flink_cid} END AS channel_id"), "append")
    raise KeyError(query)


def _end_s(p: dict[str, Any]) -> float:
    start = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
    return start + p["durationMs"]["triggerExecution"] / 1000


def _parquet_rows(path: str) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(os.path.join(d, f)).metadata.num_rows
               for d, _, fs in os.walk(path) for f in fs if f.endswith(".parquet"))


def configure(spark) -> None:
    """The session settings every query runs with: the HDFS-backed state store, UTC."""
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", HDFS_STORE)
    spark.conf.set("spark.sql.session.timeZone", "UTC")


def run_query(spark, query: str, input_dir: str, work: str, files_per_epoch: int, rss: PeakRss,
              timeout_s: float = 3600, output_dir: str | None = None) -> dict[str, Any]:
    """Run `query` to the end of its input and measure it; its output goes to `output_dir` (one
    Parquet directory per batch, batch=N) and is kept there, or to a directory deleted afterwards."""
    root = os.path.join(os.path.abspath(work), f"nexmark-spark-ss-{query}")
    shutil.rmtree(root, ignore_errors=True)
    out_dir = output_dir or os.path.join(root, "output")

    def read(stream: str):
        return (spark.readStream.schema(DDL[stream]).option("maxFilesPerTrigger", files_per_epoch)
                .parquet(os.path.join(input_dir, stream)).withWatermark("dateTime", "4 seconds"))

    df, mode = build(query, spark, read)
    rows: list[int] = []

    def write_batch(batch, batch_id: int) -> None:
        target = os.path.join(out_dir, f"batch={batch_id:08d}")
        batch.write.mode("overwrite").parquet(target)
        rows.append(_parquet_rows(target))

    rss.reset()
    started = time.monotonic()
    q = (df.writeStream.outputMode(mode).trigger(availableNow=True)
         .option("checkpointLocation", os.path.join(root, "checkpoint")).foreachBatch(write_batch).start())
    # (monotonic s, input rows of the batches done, CPU s of this process tree) as the batches end.
    samples: list[tuple[float, int, float]] = []
    while q.isActive:
        if time.monotonic() - started > timeout_s:
            q.stop()
            raise TimeoutError(f"Spark SS {query} ran past {timeout_s} s")
        done = sum(_events(p) for p in _progress(q))
        if not samples or done != samples[-1][1]:
            samples.append((time.monotonic(), done, tree_cpu_s()))
        time.sleep(0.1)
    if q.exception() is not None:
        raise RuntimeError(f"the Spark query {query} failed: {q.exception()}")
    wall = time.monotonic() - started
    progress = sorted(_progress(q), key=lambda p: p["batchId"])
    final = (time.monotonic(), sum(_events(p) for p in progress), tree_cpu_s())
    data = [p for p in progress if _events(p) > 0]
    total = sum(_events(p) for p in data)
    eps = cpu_run = events_run = None
    if len(data) > 1:
        events_run = total - _events(data[0])
        eps = events_run / (_end_s(data[-1]) - _end_s(data[0]))
        first = next((s for s in samples if s[1] >= _events(data[0])), None)
        cpu_run = final[2] - first[2] if first else None
    batch_ms = [p["durationMs"]["triggerExecution"] for p in data]
    commit_ms = [o.get("commitTimeMs", 0) for p in data for o in p.get("stateOperators", [])]
    out = {
        "system": "spark-ss", "config": "hdfs", "query": query, "events": total, "output_mode": mode,
        "events_per_s": eps, "wall_s": wall, "events_per_s_incl_startup": total / wall if wall else None,
        "output_rows": sum(rows), "batches": len(progress),
        "ckpt_note": "every batch", "ckpt_p50_ms": None, "ckpt_p99_ms": None,
        "batch_ms_p50": _pct(batch_ms, 50), "batch_ms_p99": _pct(batch_ms, 99),
        "state_commit_ms_median": statistics.median(commit_ms) if commit_ms else None,
        "peak_rss_mb": rss.peak_mb, "peak_rss_by_process": rss.breakdown, "cpu_s": cpu_run,
        "cpu_s_per_m_events": 1e6 * cpu_run / events_run if cpu_run is not None and events_run else None,
    }
    shutil.rmtree(root, ignore_errors=True)
    return out


def _events(progress: dict[str, Any]) -> int:
    """The events a batch read. A query that reads a stream twice (q7 joins the bids with their own
    window maxima) has two sources of the same files, which Spark counts twice in numInputRows:
    each stream's files count once here, as sparkpoint and Flink read them once."""
    per_stream: dict[str, int] = {}
    for source in progress.get("sources", []):
        per_stream[source["description"]] = max(per_stream.get(source["description"], 0), source["numInputRows"])
    return sum(per_stream.values()) if per_stream else progress["numInputRows"]


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return float(s[max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))])


def _progress(q) -> list[dict[str, Any]]:
    return [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in q.recentProgress]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--files-per-stream", type=int, default=20)
    p.add_argument("--files-per-epoch", type=int, default=2)
    p.add_argument("--work", default="/tmp/sparkpoint-bench")
    args = p.parse_args()
    from nexmark import ensure_input  # the same input directory bench/nexmark.py uses
    from sparkpoint.connectors.nexmark_io import write_side_input
    from sparkpoint.runtime.spark import get_or_create_spark

    input_dir = ensure_input(args.work, args.events, args.files_per_stream)
    side = os.path.join(os.path.abspath(args.work), "nexmark-side-input.csv")
    write_side_input(side)
    os.environ["NEXMARK_SIDE_INPUT"] = side
    spark = get_or_create_spark("local[2]", "bench-nexmark-spark-ss", 2)
    configure(spark)
    rss = PeakRss()
    for query in [q.strip() for q in args.queries.split(",") if q.strip()]:
        if query in CANNOT_EXPRESS:
            result = {"system": "spark-ss", "config": "hdfs", "query": query, "cannot_express": CANNOT_EXPRESS[query]}
        else:
            try:
                result = run_query(spark, query, input_dir, args.work, args.files_per_epoch, rss)
            except (RuntimeError, TimeoutError, KeyError) as e:
                result = {"system": "spark-ss", "config": "hdfs", "query": query, "failed": repr(e)[:2000]}
        result["loadavg_1m_after"] = os.getloadavg()[0]
        print("RESULT " + json.dumps(result), flush=True)
    rss.stop()
    spark.stop()


if __name__ == "__main__":
    main()
