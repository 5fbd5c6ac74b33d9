"""W1 on Spark Structured Streaming (the peer): groupBy(key).agg(count, sum) in update
mode over the same events as bench/w1_keyed_aggregate.py, read from Parquet files (one
file per sparkpoint epoch, maxFilesPerTrigger=1, so batches are the same size).

    python bench/w1_spark_ss.py [--events 5000000] [--keys 100000] [--epoch-records 500000]
        [--stores rocksdb,hdfs] [--runs 1] [--work /tmp/sparkpoint-bench]

Settings: local[2], spark.sql.shuffle.partitions=2, trigger(processingTime=100 ms)
(shorter than a batch, so the query never idles while files wait), the output of each
batch written as Parquet by foreachBatch (sparkpoint's runs write Parquet too). State
store: RocksDB with changelog checkpointing, or the default HDFS-backed store. Spark SS
commits its state every batch, so the comparison point is sparkpoint with checkpoints on.

Prints one JSON line per run (prefixed `RESULT `): events/s after start-up (end of
batch 0 to end of the last batch, from recentProgress), the median of
processedRowsPerSecond over those batches, the state commit time per batch, and the size
of the checkpoint location's state directory at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from datetime import datetime
from typing import Any

from w1_workload import W1, ensure_parquet_events, spark_session, workload_arguments
from process_tree import PeakRss, tree_cpu_s

PROVIDERS = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}
TRIGGER = "100 milliseconds"


def _progress(q) -> list[dict[str, Any]]:
    return [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in q.recentProgress]


def _end_s(p: dict[str, Any]) -> float:
    start = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
    return start + p["durationMs"]["triggerExecution"] / 1000


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def run_once(spark, w1: W1, files: str, store: str, work: str, run: int, timeout_s: float = 900) -> dict[str, Any]:
    from pyspark.sql import functions as F

    root = os.path.join(work, f"ss-{store}-{run}")
    shutil.rmtree(root, ignore_errors=True)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS[store])
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
                   "true" if store == "rocksdb" else "false")
    out_dir = os.path.join(root, "output")

    def write_batch(batch, batch_id: int) -> None:
        batch.write.mode("overwrite").parquet(os.path.join(out_dir, f"batch={batch_id:08d}"))

    events = (spark.readStream.schema("key BIGINT, value BIGINT, ts BIGINT")
              .option("maxFilesPerTrigger", 1).parquet(files))
    agg = events.groupBy("key").agg(F.count(F.lit(1)).alias("count"), F.sum("value").alias("sum"))
    started, cpu0 = time.monotonic(), tree_cpu_s()
    q = (agg.writeStream.outputMode("update").trigger(processingTime=TRIGGER)
         .option("checkpointLocation", os.path.join(root, "checkpoint"))
         .foreachBatch(write_batch).start())
    try:
        while True:
            batches = [p for p in _progress(q) if p["numInputRows"] > 0]
            if sum(p["numInputRows"] for p in batches) >= w1.events:
                break
            if q.exception() is not None:
                raise RuntimeError(f"the Spark query failed: {q.exception()}")
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"Spark SS ({store}) did not read {w1.events} events in {timeout_s} s")
            time.sleep(0.2)
        wall, cpu = time.monotonic() - started, tree_cpu_s() - cpu0
    finally:
        q.stop()
    batches.sort(key=lambda p: p["batchId"])
    first, rest = batches[0], batches[1:]
    rows = sum(p["numInputRows"] for p in rest)
    commit_ms = [p["stateOperators"][0].get("commitTimeMs", 0) for p in rest if p.get("stateOperators")]
    out = {
        "system": "spark-ss", "config": store, "run": run, "events": sum(p["numInputRows"] for p in batches),
        "keys": w1.keys, "epoch_records": w1.epoch_records, "batches": len(batches),
        "events_per_s": rows / (_end_s(batches[-1]) - _end_s(first)),
        "processed_rows_per_s_median": statistics.median(p["processedRowsPerSecond"] for p in rest),
        "batch_ms_median": statistics.median(p["durationMs"]["triggerExecution"] for p in rest),
        "state_commit_ms_median": statistics.median(commit_ms) if commit_ms else None,
        "state_commit_ms_max": max(commit_ms) if commit_ms else None,
        "state_dir_bytes_end": _dir_bytes(os.path.join(root, "checkpoint", "state")),
        "wall_s": wall, "events_per_s_incl_startup": w1.events / wall,
        "cpu_s": cpu, "cpu_us_per_event": 1e6 * cpu / w1.events,
    }
    shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0])
    parser.add_argument("--stores", default="rocksdb,hdfs")
    args = parser.parse_args()
    w1 = W1(args.events, args.keys, args.epoch_records)
    spark = spark_session("bench-w1-spark-ss")
    data = os.path.join(args.work, "data")
    files = ensure_parquet_events(spark, w1, data)
    if args.warmup_events:
        warm = W1(args.warmup_events, args.keys, args.epoch_records)
        run_once(spark, warm, ensure_parquet_events(spark, warm, data), "hdfs", args.work, -1)
    stores = args.stores.split(",")
    # Peak memory of this process tree (driver, JVM, Python workers) as PSS, like W2's.
    rss = PeakRss()
    for run in range(args.first_run, args.first_run + args.runs):
        # Alternate the order run by run so drift in the machine's load hits every store alike.
        for store in (stores if run % 2 == 0 else stores[::-1]):
            rss.reset()
            result = run_once(spark, w1, files, store, args.work, run)
            result["peak_rss_mb"], result["peak_rss_by_process"] = rss.peak_mb, rss.breakdown
            result["loadavg_1m_after"] = os.getloadavg()[0]
            print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
