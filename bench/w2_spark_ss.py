"""W2 on Spark Structured Streaming (the peer): 60 s event-time tumbling windows, count per
key, watermark 5 s, append mode, over the same events as bench/w2_window.py read from
Parquet files (one file per sparkpoint epoch, maxFilesPerTrigger=1, so batches are the
same size); `--window sliding|session` runs its variants.

    python bench/w2_spark_ss.py [--events 5000000] [--keys 100000] [--epoch-records 500000]
        [--event-time-per-s 5000] [--stores rocksdb,hdfs] [--runs 1] [--work /tmp/sparkpoint-bench]
        [--window tumbling|sliding|session] [--slide-s 10] [--gap-s 30]

Query: `withWatermark("event_time", "5 seconds")` on `timestamp_millis(ts)`, then
`groupBy(window(event_time, "60 seconds"), key).count()`, `outputMode("append")`,
`trigger(processingTime=100 ms)`, foreachBatch writing Parquet. State store: RocksDB
with changelog checkpointing, or the default HDFS-backed store. The input ends with a
one-row sentinel file (bench/w2_workload.py) that advances the watermark past the last
window, so every real window is emitted, as sparkpoint's final epoch fires them all.
The variants group by `window(event_time, "60 seconds", "10 seconds")` or
`session_window(event_time, "30 seconds")` instead (bench/w2_windows.py).

Prints one JSON line per run (prefixed `RESULT `): events/s after start-up = events
after batch 0 divided by the time from the end of batch 0 to the end of the batch that
emitted the last window rows; output_rows (asserted equal to the distinct (window, key)
pairs of the input, or to its sessions, computed apart from the run); state commit time
per batch; peak_rss_mb of the process tree.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from datetime import datetime
from typing import Any

import pyarrow.parquet as pq

import w2_windows
from w2_windows import WINDOW_MS, Windowing
from process_tree import PeakRss, tree_cpu_s
from w2_workload import (DELAY_MS, W2, ensure_parquet_events, expected_output_rows, from_args,
                         spark_session, workload_arguments)

PROVIDERS = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}
TRIGGER = "100 milliseconds"


def await_rows(q, emitted: list, want: int, started: float, timeout_s: float, who: str, what: str) -> None:
    """Until the query's batches (`emitted`: (batch, ..., rows) each) hold `want` rows;
    raises if the query failed or `timeout_s` passed since `started`."""
    while sum(r for _, _, r in emitted) < want:
        if q.exception() is not None:
            raise RuntimeError(f"the Spark query failed: {q.exception()}")
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{who} emitted {sum(r for _, _, r in emitted)} of {want} {what} in {timeout_s} s")
        time.sleep(0.2)


def _progress(q) -> list[dict[str, Any]]:
    return [json.loads(p.json) if hasattr(p, "json") else dict(p) for p in q.recentProgress]


def _end_s(p: dict[str, Any]) -> float:
    start = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
    return start + p["durationMs"]["triggerExecution"] / 1000


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _parquet_rows(path: str) -> int:
    return sum(pq.ParquetFile(os.path.join(d, f)).metadata.num_rows
               for d, _, fs in os.walk(path) for f in fs if f.endswith(".parquet"))


def run_once(spark, w2: W2, files: str, store: str, work: str, run: int, rss: PeakRss,
             windowing: Windowing = Windowing(), timeout_s: float = 1800) -> dict[str, Any]:
    from pyspark.sql import functions as F

    expected = expected_output_rows(spark, w2, os.path.join(work, "data"), windowing)
    root = os.path.join(work, f"ss-{windowing.workload}-{store}-{run}")
    shutil.rmtree(root, ignore_errors=True)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS[store])
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
                   "true" if store == "rocksdb" else "false")
    out_dir = os.path.join(root, "output")
    emitted: list[tuple[int, float, int]] = []  # (batch id, wall time written, rows)

    def write_batch(batch, batch_id: int) -> None:
        target = os.path.join(out_dir, f"batch={batch_id:08d}")
        batch.write.mode("overwrite").parquet(target)
        emitted.append((batch_id, time.time(), _parquet_rows(target)))

    events = (spark.readStream.schema("key BIGINT, value BIGINT, ts BIGINT")
              .option("maxFilesPerTrigger", 1).parquet(files))
    windowed = (events.withColumn("event_time", F.timestamp_millis("ts"))
                .withWatermark("event_time", f"{DELAY_MS // 1000} seconds")
                .groupBy(windowing.spark_column("event_time").alias("window"), "key").count()
                .select("key", F.col("window.start").alias("window_start"),
                        F.col("window.end").alias("window_end"), "count"))
    rss.reset()
    started, cpu0 = time.monotonic(), tree_cpu_s()
    q = (windowed.writeStream.outputMode("append").trigger(processingTime=TRIGGER)
         .option("checkpointLocation", os.path.join(root, "checkpoint"))
         .foreachBatch(write_batch).start())
    try:
        await_rows(q, emitted, expected["output_rows"], started, timeout_s,
                   f"Spark SS {windowing.workload} ({store})", "rows")
        wall, cpu = time.monotonic() - started, tree_cpu_s() - cpu0
        time.sleep(0.5)  # let the progress of the last batch be posted
        progress = _progress(q)
    finally:
        q.stop()
    peak = rss.peak_mb
    output_rows = sum(r for _, _, r in emitted)
    if output_rows != expected["output_rows"]:
        raise AssertionError(f"Spark SS {windowing.workload} ({store}) emitted {output_rows} rows, expected "
                             f"{expected['output_rows']} (the input's distinct window × key pairs, or its sessions)")
    progress.sort(key=lambda p: p["batchId"])
    last_id = max(b for b, _, r in emitted if r > 0)
    data = [p for p in progress if p["numInputRows"] > 0]
    rows_total = sum(p["numInputRows"] for p in data)
    first = data[0]
    last = next(p for p in progress if p["batchId"] == last_id)
    rest = [p for p in progress if first["batchId"] < p["batchId"] <= last_id]
    commit_ms = [p["stateOperators"][0].get("commitTimeMs", 0) for p in rest if p.get("stateOperators")]
    events_after_0 = rows_total - first["numInputRows"] - 1  # the one-row sentinel is not an event
    out = {
        "system": "spark-ss", "config": store, "workload": windowing.workload, "run": run,
        "events": rows_total - 1,
        "keys": w2.keys, "epoch_records": w2.epoch_records, "event_time_per_s": w2.event_time_per_s,
        **windowing.fields(), "windows": expected["windows"], "output_rows": output_rows,
        "batches": len(progress), "batches_with_data": len(data),
        "events_per_s": events_after_0 / (_end_s(last) - _end_s(first)),
        "processed_rows_per_s_median": statistics.median(p["processedRowsPerSecond"] for p in data[1:-1] or data),
        "batch_ms_median": statistics.median(p["durationMs"]["triggerExecution"] for p in rest),
        "state_commit_ms_median": statistics.median(commit_ms) if commit_ms else None,
        "state_commit_ms_max": max(commit_ms) if commit_ms else None,
        "state_rows_max": max((p["stateOperators"][0].get("numRowsTotal", 0) for p in rest
                               if p.get("stateOperators")), default=None),
        "late_dropped": sum(p["stateOperators"][0].get("numRowsDroppedByWatermark", 0) for p in progress
                            if p.get("stateOperators")),
        "state_dir_bytes_end": _dir_bytes(os.path.join(root, "checkpoint", "state")),
        "wall_s": wall, "events_per_s_incl_startup": (rows_total - 1) / wall,
        "peak_rss_mb": peak, "peak_rss_by_process": rss.breakdown,
        "cpu_s": cpu, "cpu_us_per_event": 1e6 * cpu / max(1, rows_total),
    }
    shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0])
    parser.add_argument("--stores", default="rocksdb,hdfs")
    args = parser.parse_args()
    w2, windowing = from_args(args), w2_windows.from_args(args)
    if windowing.reach_ms > WINDOW_MS:
        # The sentinel (bench/w2_workload.py) moves the watermark one window length past the last event.
        parser.error(f"windows reaching {windowing.reach_ms} ms past their last event would not all be emitted: "
                     f"the sentinel advances the watermark {WINDOW_MS} ms past the last event")
    rss = PeakRss()
    spark = spark_session(f"bench-{windowing.workload}-spark-ss")
    data = os.path.join(args.work, "data")
    files = ensure_parquet_events(spark, w2, data)
    if args.warmup_events:
        warm = W2(args.warmup_events, args.keys, args.epoch_records, args.event_time_per_s)
        run_once(spark, warm, ensure_parquet_events(spark, warm, data), "hdfs", args.work, -1, rss, windowing)
    stores = args.stores.split(",")
    for run in range(args.first_run, args.first_run + args.runs):
        # Alternate the order run by run so drift in the machine's load hits every store alike.
        for store in (stores if run % 2 == 0 else stores[::-1]):
            result = run_once(spark, w2, files, store, args.work, run, rss, windowing)
            result["loadavg_1m_after"] = os.getloadavg()[0]
            print("RESULT " + json.dumps(result), flush=True)
    rss.stop()
    spark.stop()


if __name__ == "__main__":
    main()
