"""End-to-end latency at a steady input rate: event in → visible in committed output,
p50/p99 per event, sparkpoint (checkpoints every 1 s) vs Spark Structured Streaming
(default trigger, HDFS-backed state store), W1-shaped keyed aggregate (count + sum per
key over K keys).

    python bench/latency.py [--systems sparkpoint,spark-ss] [--rate 50000] [--duration-s 60]
        [--keys 100000] [--skip-s 5] [--warmup-s 10] [--work /tmp/sparkpoint-bench]

Each system runs in its own fresh process (this script re-runs itself with one system):
a discarded warm-up run of --warmup-s, then the measured run of --duration-s.

Event-in time (both): the time an event becomes part of the input stream at the given
rate, event number g at T0 + g / rate — the ideal arrival time of a steady source:
  - sparkpoint: `GeneratorSource(rate_per_s=rate, event_time_per_s=rate, disorder_ms=0)`
    with its start time set to the wall clock of its first plan − 0.5 s (the rate
    limiter's first budget is 0.5 s of events), so each event's `ts` is its arrival time;
    an epoch reads every event that arrived since the previous epoch's plan.
  - Spark SS: the `rate` source, rowsPerSecond = rate; its `timestamp` column is
    creation time + value / rate (checked), i.e. the same arrival time. The rate source's
    offsets are whole seconds, so a second's rows are read only once that second is over:
    this source holds each event 0–1 s (0.5 s on average) before Spark can read it; it is
    part of the latency measured (also reported without it: `latency_from_readable_*`).
  Keys and values are the generator's functions of the event number (xxhash64 of g).
Visible-in-committed-output time:
  - sparkpoint: the wall time `ParquetSink.commit` returns for the checkpoint covering the
    event's epoch (the output log batch naming the epoch's files is written: readers that
    follow `_spark_metadata` see the rows). Checkpoints every 1 s, completed at the end of
    the epoch they were triggered in, committed by the sink right after.
  - Spark SS: the modification time of the query's `commits/<batch id>` file (written
    after foreachBatch has written the batch's Parquet output: the batch is committed
    and will not be replayed).
Latency per event = visible time − event-in time; p50/p99 over every event whose arrival
is after the first --skip-s seconds of the measured run (start-up excluded) and within its
--duration-s.

Prints one `RESULT {json}` line per system: system, config, workload "latency", rate,
latency_p50_ms, latency_p99_ms, latency_max_ms, latency_mean_ms, events (input events
of the measured run), events_measured, commits (output commits in the run), peak_rss_mb
(process tree: driver + JVM + Python workers), loadavg_1m_after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import numpy as np

from process_tree import PeakRss
from w2_workload import spark_session

SPLITS = 2
SEED = 7


def _percentiles(lat_ms: np.ndarray) -> dict[str, Any]:
    return {"latency_p50_ms": round(float(np.percentile(lat_ms, 50)), 1),
            "latency_p99_ms": round(float(np.percentile(lat_ms, 99)), 1),
            "latency_max_ms": round(float(lat_ms.max()), 1),
            "latency_mean_ms": round(float(lat_ms.mean()), 1)}


# -- sparkpoint -------------------------------------------------------------------------------
def run_sparkpoint(spark, args, duration_s: float, run: str, rss: PeakRss) -> dict[str, Any]:
    from sparkpoint.api import KeyedAggregate
    from sparkpoint.api.pipeline import Pipeline
    from sparkpoint.config import Settings
    from sparkpoint.connectors.generator import GeneratorSource
    from sparkpoint.connectors.parquet_sink import ParquetSink
    from sparkpoint.runtime.jobmaster import JobMaster

    class WallClockGenerator(GeneratorSource):
        """Event time = arrival time: the start of event time is set at the first plan."""

        def plan(self, positions):
            if self._last_plan_at is None:
                self.start_ts_ms = int(time.time() * 1000) - 500  # the first budget is 0.5 s of events
            return super().plan(positions)

    epochs: list[tuple[int, dict, dict]] = []  # (epoch, start positions, end positions)

    class LatencyJobMaster(JobMaster):
        def _run_one_epoch(self, plans, final: bool) -> None:
            super()._run_one_epoch(plans, final)
            plan = plans[source.name]  # the epoch's slice of each source, by name
            if any(plan.end[s] > plan.start[s] for s in plan.start):
                epochs.append((self.epoch, dict(plan.start), dict(plan.end)))

    name = f"latency-sparkpoint-{run}"
    root = os.path.join(args.work, name)
    shutil.rmtree(root, ignore_errors=True)
    total = int(args.rate * duration_s)
    source = WallClockGenerator("events", keys=args.keys, splits=SPLITS, total_events=total, rate_per_s=args.rate,
                                max_records_per_epoch=10 * total, seed=SEED, event_time_per_s=args.rate,
                                disorder_ms=0)
    sink = ParquetSink(os.path.join(root, "output"))
    commits: list[tuple[float, int]] = []  # (wall s when visible, last epoch covered)
    commit = sink.commit

    def recording_commit(handle) -> None:
        commit(handle)
        commits.append((time.time(), int(handle["last_epoch"])))

    sink.commit = recording_commit
    pipeline = (Pipeline(name).source(source)
                .stateful(KeyedAggregate("lat", ["key"], "value", aggs=("count", "sum"), value_type="bigint"))
                .sink(sink))
    settings = Settings.load(overrides={
        "pipeline.name": name,
        "parallelism.default": 2,
        "execution.checkpointing.dir": os.path.join(root, "checkpoints"),
        "execution.checkpointing.enabled": True,
        "execution.checkpointing.interval": args.checkpoint_interval,
        "state.local.dir": os.path.join(root, "state"),
        "sparkpoint.progress": False,
        "rest.port": 0,  # any free port: the measurement never asks the REST API
    })
    job = LatencyJobMaster(pipeline, settings, spark=spark)
    rss.reset()
    result = job.run()
    peak = rss.peak_mb
    if not commits:
        raise RuntimeError("sparkpoint: no sink commit was recorded (is the sink object the job's?)")
    commit_times = np.array([t for t, _ in commits]) * 1000
    commit_epochs = np.array([e for _, e in commits])
    start_ts = source.start_ts_ms
    lats = []
    for epoch, start, end in epochs:
        i = int(np.searchsorted(commit_epochs, epoch))  # the first commit covering the epoch
        if i == len(commit_epochs):
            raise RuntimeError(f"sparkpoint: epoch {epoch} was never committed")
        for split, s0 in start.items():
            g = np.arange(s0, end[split], dtype=np.int64) * SPLITS + int(split)
            arrival = start_ts + g * 1000.0 / args.rate
            lats.append((arrival, commit_times[i] - arrival))
    arrival = np.concatenate([a for a, _ in lats])
    lat = np.concatenate([x for _, x in lats])
    skip_s = args.skip_s if run == "measured" else 0
    keep = arrival >= start_ts + skip_s * 1000
    epoch_sizes = [sum(e[k] - s[k] for k in s) for _, s, e in epochs]
    config = "ckpt-" + args.checkpoint_interval.replace(" ", "")
    return {"system": "sparkpoint", "config": config, "workload": "latency", "rate": args.rate,
            **_percentiles(lat[keep]), "events": result.records, "events_measured": int(keep.sum()),
            "keys": args.keys, "duration_s": duration_s, "commits": len(commits), "epochs": len(epochs),
            "epoch_events_median": float(np.median(epoch_sizes)) if epoch_sizes else None,
            "peak_rss_mb": peak, "peak_rss_by_process": rss.breakdown, "status": result.status.value}


# -- Spark Structured Streaming -----------------------------------------------------------------
def run_spark_ss(spark, args, duration_s: float, run: str, rss: PeakRss) -> dict[str, Any]:
    import pyarrow.parquet as pq
    from pyspark.sql import functions as F

    root = os.path.join(args.work, f"latency-ss-{run}")
    shutil.rmtree(root, ignore_errors=True)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                   "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider")
    out_dir, ckpt = os.path.join(root, "output"), os.path.join(root, "checkpoint")
    batch_max_ts: dict[int, int] = {}

    def write_batch(batch, batch_id: int) -> None:
        target = os.path.join(out_dir, f"batch={batch_id:08d}")
        batch.write.mode("overwrite").parquet(target)
        # The batch's last event time, from what was just written (the output carries
        # max(timestamp) per key): fixes the rate source's creation time exactly.
        for d, _, fs in os.walk(target):
            for f in fs:
                if f.endswith(".parquet"):
                    col = pq.read_table(os.path.join(d, f), columns=["last_ts"]).column("last_ts")
                    if len(col):
                        v = int(col.to_numpy().max())  # epoch ms
                        batch_max_ts[batch_id] = max(batch_max_ts.get(batch_id, v), v)

    g = F.col("value")
    events = (spark.readStream.format("rate").option("rowsPerSecond", args.rate)
              .option("numPartitions", SPLITS).load()
              .select(F.pmod(F.xxhash64(F.lit(SEED), g), F.lit(args.keys)).alias("key"),
                      F.pmod(F.xxhash64(F.lit(SEED + 2), g), F.lit(1000)).alias("value"),
                      F.col("timestamp")))
    agg = events.groupBy("key").agg(F.count(F.lit(1)).alias("count"), F.sum("value").alias("sum"),
                                    F.unix_millis(F.max("timestamp")).alias("last_ts"))
    writer = agg.writeStream.outputMode("update").option("checkpointLocation", ckpt).foreachBatch(write_batch)
    if args.ss_trigger != "default":
        writer = writer.trigger(processingTime=args.ss_trigger)
    rss.reset()
    started = time.monotonic()
    q = writer.start()
    try:
        while True:
            done = [json.loads(p.json) for p in q.recentProgress]
            ends = [int(p["sources"][0]["endOffset"]) for p in done if p["numInputRows"] > 0]
            if ends and max(ends) >= duration_s:
                break
            if q.exception() is not None:
                raise RuntimeError(f"the Spark query failed: {q.exception()}")
            if time.monotonic() - started > duration_s + 600:
                raise TimeoutError("Spark SS did not reach the end of the run")
            time.sleep(0.2)
    finally:
        q.stop()
    peak = rss.peak_mb
    progress = [json.loads(p.json) for p in q.recentProgress]
    batches = []  # (batch id, start second, end second, commit wall ms)
    for p in progress:
        if p["numInputRows"] <= 0:
            continue
        commit_file = os.path.join(ckpt, "commits", str(p["batchId"]))
        if not os.path.exists(commit_file):
            continue  # stopped before its commit
        start = int(p["sources"][0]["startOffset"]) if p["sources"][0]["startOffset"] is not None else 0
        batches.append((p["batchId"], start, int(p["sources"][0]["endOffset"]), os.stat(commit_file).st_mtime * 1000))
    if len(progress) >= 100:
        print("warning: recentProgress keeps the last 100 batches only", file=sys.stderr)
    # Creation time of the rate source: the last event of a batch (value end*rate - 1)
    # has timestamp creation + (end*rate - 1) * 1000 / rate.
    b_id, _, b_end, _ = next(b for b in batches if b[0] in batch_max_ts)
    creation = batch_max_ts[b_id] - (b_end * args.rate - 1) * 1000.0 / args.rate
    lat, lat_readable, arrival_all = [], [], []
    for _, s0, s1, committed in batches:
        v = np.arange(s0 * args.rate, s1 * args.rate, dtype=np.int64)
        arrival = creation + v * 1000.0 / args.rate
        readable = creation + (v // args.rate + 1) * 1000.0  # when the rate source lets it be read
        lat.append(committed - arrival)
        lat_readable.append(committed - readable)
        arrival_all.append(arrival)
    arrival, lat, lat_readable = np.concatenate(arrival_all), np.concatenate(lat), np.concatenate(lat_readable)
    skip_s = args.skip_s if run == "measured" else 0
    keep = (arrival >= creation + skip_s * 1000) & (arrival < creation + duration_s * 1000)
    readable = _percentiles(lat_readable[keep])
    shutil.rmtree(root, ignore_errors=True)
    return {"system": "spark-ss", "config": f"hdfs-trigger-{args.ss_trigger.replace(' ', '')}",
            "workload": "latency", "rate": args.rate, **_percentiles(lat[keep]),
            "latency_from_readable_p50_ms": readable["latency_p50_ms"],
            "latency_from_readable_p99_ms": readable["latency_p99_ms"],
            "events": int(sum((b[2] - b[1]) * args.rate for b in batches)), "events_measured": int(keep.sum()),
            "keys": args.keys, "duration_s": duration_s, "commits": len(batches),
            "batch_ms_median": float(np.median([p["durationMs"]["triggerExecution"] for p in progress
                                                if p["numInputRows"] > 0])),
            "peak_rss_mb": peak, "peak_rss_by_process": rss.breakdown}


RUNNERS = {"sparkpoint": run_sparkpoint, "spark-ss": run_spark_ss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="sparkpoint,spark-ss")
    parser.add_argument("--rate", type=int, default=50_000, help="events per second")
    parser.add_argument("--duration-s", type=float, default=60)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--skip-s", type=float, default=5, help="events of the first seconds are not measured")
    parser.add_argument("--warmup-s", type=float, default=10, help="a discarded run first (0: none)")
    parser.add_argument("--ss-trigger", default="default",
                        help="Spark SS trigger: 'default' (next batch as soon as the last one ends) or a "
                             "processingTime such as '500 milliseconds'")
    parser.add_argument("--checkpoint-interval", default="1 s",
                        help="sparkpoint's execution.checkpointing.interval (its output is visible when the "
                             "checkpoint covering it commits)")
    parser.add_argument("--work", default="/tmp/sparkpoint-bench")
    args = parser.parse_args()
    systems = args.systems.split(",")
    if len(systems) > 1:  # one fresh process per system, so both pay the same JVM start
        for system in systems:
            cmd = [sys.executable, os.path.abspath(__file__), *[a for a in sys.argv[1:]], "--systems", system]
            subprocess.run(cmd, check=True)
        return
    system = systems[0]
    rss = PeakRss()
    spark = spark_session(f"bench-latency-{system}")
    if args.warmup_s:
        RUNNERS[system](spark, args, args.warmup_s, "warmup", rss)
    result = RUNNERS[system](spark, args, args.duration_s, "measured", rss)
    result["loadavg_1m_after"] = os.getloadavg()[0]
    print("RESULT " + json.dumps(result), flush=True)
    rss.stop()
    spark.stop()


if __name__ == "__main__":
    main()
