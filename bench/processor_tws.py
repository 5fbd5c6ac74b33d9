"""Custom processor: the README's `Sessionize` (map state, event-time timers) on sparkpoint
and on Spark Structured Streaming's `transformWithStateInPandas`, the same processor body on
the same Parquet input.

    python bench/processor_tws.py [--events 2000000] [--keys 10000] [--epoch-records 100000]
        [--event-time-per-s 0] [--systems sparkpoint,spark-tws] [--runs 1] [--work /tmp/sparkpoint-bench]

Events: the records of `GeneratorSource(seed=7, splits=2)` as in W2 (bench/w2_workload.py:
keys uniform over K, disorder up to 2 s, below the 5 s watermark delay: no row is late),
written once as Parquet, one file per sparkpoint epoch. Event time advances
`--event-time-per-s` events per second of event time; 0 (the default) means K / 15, so a
key clicks every 15 s on average and about one pause in seven is longer than the 30 s gap:
sessions open and close all through the run (2 M events over 10 k keys: ~3,000 s of event
time, ~280 k sessions).

The processor: the README block `class Sessionize(StatefulProcessor)` executed as written
(tests/sessionize.py). sparkpoint runs that class. Spark runs a class built from the same
attribute dict (the same function objects: `init`, `handleInputRows`, `handleExpiredTimer`)
on `pyspark.sql.streaming.StatefulProcessor`, because `transformWithStateInPandas` needs
an instance of PySpark's base class. Nothing in the body differs between the systems; the
state and timer calls it makes (`getMapState(name, key DDL, value DDL)`, `iterator()`
yielding (key tuple, value tuple), `clear`, `updateValue`, `removeKey`, `listTimers`,
`deleteTimer`, `registerTimer`, `getExpiryTimeInMs`) have the same names, arguments and
results in both APIs. The key is a 1-tuple in both (`key[0]`). One difference in what the
body is handed, which it already handles: Spark may pass a key's rows of a batch as several
DataFrames (Arrow batches), sparkpoint as one; the README loops over `rows` either way.

- sparkpoint: `FileSource(format="parquet", max_files_per_epoch=1, bounded=True)` →
  `.watermark("ts", delay="5 s")` → `ProcessorOperator("sessionize", Sessionize, ["key"],
  ..., time_mode="eventtime")` → `ParquetSink`; in-process JobMaster, parallelism 2,
  checkpoints every 1 s (other settings default).
- Spark TWS: `readStream.parquet(maxFilesPerTrigger=1)` → `withWatermark` on
  `timestamp_millis(ts)`, 5 s → `groupBy("key").transformWithStateInPandas(Sessionize(),
  ..., outputMode="Append", timeMode="EventTime")` → `foreachBatch` writing Parquet;
  `RocksDBStateStoreProvider` (transformWithState requires it) with changelog
  checkpointing, `local[2]`, `spark.sql.shuffle.partitions=2`, AQE off,
  `trigger(processingTime=100 ms)`.

End of input: the last file is W2's one-row sentinel (key −1, event time > 60 s past the
last event), whose only effect is to move the watermark past every real session's timer,
so Spark fires them all (sparkpoint's bounded run fires every timer at the end anyway).
The sentinel's own session (key −1) is left out of every comparison.

Check: both systems' sessions (key, session_start, session_end, events) must equal an
independent pandas sessionization of the Parquet events (a click more than 30 s after the
key's previous one starts a new session; exactly 30 s stays in it, as Spark's
session_window: `reference_sessions` of tests/unit/testing/test_readme_backfill.py), so they
equal each other; each RESULT carries `sessions_sha256` of its sorted sessions, and a
process that runs both systems also asserts the two are equal.

Prints one JSON line per run (prefixed `RESULT `): events/s after start-up = events after
epoch/batch 0 divided by the time from the end of epoch/batch 0 to the end of the one that
emitted the last sessions (sparkpoint: its final epoch, which fires the timers left; the
final checkpoint after it is excluded); epoch/batch seconds (median), sparkpoint checkpoint
p50/p99, Spark's state commit ms per batch, peak_rss_mb and CPU µs per event of the
process tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import time
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from sparkpoint.api.pipeline import Pipeline
from sparkpoint.api.processor import ProcessorOperator
from sparkpoint.config import Settings
from sparkpoint.connectors.files import FileSource
from sparkpoint.connectors.parquet_sink import ParquetSink, read_committed

from tests.sessionize import Sessionize
from tests.unit.testing.test_readme_backfill import reference_sessions
from w2_spark_ss import PROVIDERS, TRIGGER, _dir_bytes, _end_s, _parquet_rows, _progress, await_rows
from w2_window import MeasuredJobMaster
from process_tree import PeakRss, tree_cpu_s
from w2_workload import DELAY_MS, W2, ensure_parquet_events, spark_session, workload_arguments

SENTINEL_KEY = -1
OUTPUT = "key BIGINT, session_start BIGINT, session_end BIGINT, events BIGINT"
INPUT = "key BIGINT, value BIGINT, ts BIGINT"
SESSION_COLS = ["key", "session_start", "session_end", "events"]
MEAN_CLICK_PAUSE_S = 15  # keys / this = events per second of event time, unless given


def on_base(base: type) -> type:
    """The README's Sessionize with `base` as its base class: the same functions, unchanged."""
    body = {k: v for k, v in vars(Sessionize).items() if k not in ("__dict__", "__weakref__")}
    return type(base)(Sessionize.__name__, (base,), body)


def _sessions(df: pd.DataFrame) -> list[tuple[int, int, int, int]]:
    df = df[df["key"] != SENTINEL_KEY]
    return sorted(map(tuple, df[SESSION_COLS].astype("int64").to_numpy().tolist()))


def _digest(sessions: list[tuple[int, int, int, int]]) -> str:
    return hashlib.sha256(json.dumps(sessions).encode()).hexdigest()


def expected_sessions(files: str) -> list[tuple[int, int, int, int]]:
    """pandas' sessions of the events in the Parquet files, the sentinel left out."""
    events = pq.read_table(files, columns=["key", "ts"]).to_pandas()
    return reference_sessions(events[events["key"] != SENTINEL_KEY])


def _check(system: str, got: list[tuple], expected: list[tuple]) -> None:
    if got != expected:
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        raise AssertionError(f"{system} emitted {len(got)} sessions, pandas {len(expected)}: "
                             f"{len(missing)} missing (first {missing[:3]}), {len(extra)} not expected "
                             f"(first {extra[:3]}), {len(got) - len(set(got))} duplicated")


def run_sparkpoint(spark, w2: W2, files: str, expected: list[tuple], work: str, run: int,
                   rss: PeakRss) -> tuple[dict[str, Any], list[tuple]]:
    name = f"processor-sparkpoint-{run}"
    root = os.path.join(work, name)
    shutil.rmtree(root, ignore_errors=True)
    out_dir = os.path.join(root, "output")
    source = FileSource(files, format="parquet", schema=INPUT, name="clicks", max_files_per_epoch=1, bounded=True)
    pipeline = (Pipeline(name).source(source)
                .watermark("ts", delay=f"{DELAY_MS // 1000} s")
                .stateful(ProcessorOperator("sessionize", Sessionize, ["key"], OUTPUT, time_mode="eventtime"))
                .sink(ParquetSink(out_dir)))
    settings = Settings.load(overrides={
        "pipeline.name": name,
        "parallelism.default": 2,
        "execution.checkpointing.dir": os.path.join(root, "checkpoints"),
        "execution.checkpointing.enabled": True,
        "execution.checkpointing.interval": "1 s",
        "state.local.dir": os.path.join(root, "state"),
        "sparkpoint.progress": False,
    })
    job = MeasuredJobMaster(pipeline, settings, spark=spark)
    rss.reset()
    started, cpu0 = time.monotonic(), tree_cpu_s()
    result = job.run()
    wall, cpu = time.monotonic() - started, tree_cpu_s() - cpu0
    peak = rss.peak_mb
    got = _sessions(read_committed(out_dir).to_pandas())
    _check("sparkpoint", got, expected)
    (t0, _, r0), (t_last, _, r1) = job.epoch_ends[0], job.epoch_ends[-1]
    t1 = job.final_end or t_last
    epoch_s = [b[0] - a[0] for a, b in zip(job.epoch_ends, job.epoch_ends[1:])]
    stats = job.coordinator.stats.snapshot()
    events = result.records - 1  # the one-row sentinel is not an event
    out = {
        "system": "sparkpoint", "config": "ckpt-on", "workload": "processor", "run": run, "events": events,
        "keys": w2.keys, "epoch_records": w2.epoch_records, "event_time_per_s": w2.event_time_per_s,
        "sessions": len(got), "sessions_sha256": _digest(got),
        "epochs_with_data": len(job.epoch_ends),
        "events_per_s": (r1 - r0 - 1) / (t1 - t0),
        "wall_s": wall, "events_per_s_incl_startup": events / wall,
        "epoch_s_median": statistics.median(epoch_s) if epoch_s else None,
        "final_fire_s": (job.final_end - t_last) if job.final_end else None,
        "checkpoints_completed": len(job.checkpoints), "checkpoints_failed": int(stats.get("failed", 0)),
        "ckpt_failures_by_reason": stats.get("failures_by_reason", {}),
        "ckpt_p50_ms": stats.get("duration_p50_ms"), "ckpt_p99_ms": stats.get("duration_p99_ms"),
        "late_dropped": job.late_dropped,
        "peak_rss_mb": peak, "peak_rss_by_process": rss.breakdown,
        "cpu_s": cpu, "cpu_us_per_event": 1e6 * cpu / max(1, events),
        "status": result.status.value,
    }
    shutil.rmtree(root, ignore_errors=True)
    return out, got


def run_spark_tws(spark, w2: W2, files: str, expected: list[tuple], work: str, run: int, rss: PeakRss,
                  timeout_s: float = 3600) -> tuple[dict[str, Any], list[tuple]]:
    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StatefulProcessor as SparkStatefulProcessor

    root = os.path.join(work, f"processor-spark-tws-{run}")
    shutil.rmtree(root, ignore_errors=True)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDERS["rocksdb"])
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    out_dir = os.path.join(root, "output")
    emitted: list[tuple[int, float, int]] = []  # (batch id, wall time written, rows)

    def write_batch(batch, batch_id: int) -> None:
        target = os.path.join(out_dir, f"batch={batch_id:08d}")
        batch.write.mode("overwrite").parquet(target)
        emitted.append((batch_id, time.time(), _parquet_rows(target)))

    events = spark.readStream.schema(INPUT).option("maxFilesPerTrigger", 1).parquet(files)
    sessions = (events.withColumn("event_time", F.timestamp_millis("ts"))
                .withWatermark("event_time", f"{DELAY_MS // 1000} seconds")
                .groupBy("key")
                .transformWithStateInPandas(statefulProcessor=on_base(SparkStatefulProcessor)(),
                                            outputStructType=OUTPUT, outputMode="Append", timeMode="EventTime"))
    rss.reset()
    started, cpu0 = time.monotonic(), tree_cpu_s()
    q = (sessions.writeStream.outputMode("append").trigger(processingTime=TRIGGER)
         .option("checkpointLocation", os.path.join(root, "checkpoint"))
         .foreachBatch(write_batch).start())
    try:
        # Only real sessions close: the sentinel's stays open, so the count is exact.
        await_rows(q, emitted, len(expected), started, timeout_s, "Spark TWS", "sessions")
        wall, cpu = time.monotonic() - started, tree_cpu_s() - cpu0
        time.sleep(0.5)  # let the progress of the last batch be posted
        progress = _progress(q)
    finally:
        q.stop()
    peak = rss.peak_mb
    got = _sessions(pq.read_table(out_dir, partitioning=None).to_pandas())
    _check("Spark TWS", got, expected)
    progress.sort(key=lambda p: p["batchId"])
    last_id = max(b for b, _, r in emitted if r > 0)
    data = [p for p in progress if p["numInputRows"] > 0]
    rows_total = sum(p["numInputRows"] for p in data)
    first = data[0]
    last = next(p for p in progress if p["batchId"] == last_id)
    rest = [p for p in progress if first["batchId"] < p["batchId"] <= last_id]
    commit_ms = [p["stateOperators"][0].get("commitTimeMs", 0) for p in rest if p.get("stateOperators")]
    out = {
        "system": "spark-tws", "config": "rocksdb", "workload": "processor", "run": run, "events": rows_total - 1,
        "keys": w2.keys, "epoch_records": w2.epoch_records, "event_time_per_s": w2.event_time_per_s,
        "sessions": len(got), "sessions_sha256": _digest(got),
        "batches": len(progress), "batches_with_data": len(data),
        "events_per_s": (rows_total - first["numInputRows"] - 1) / (_end_s(last) - _end_s(first)),
        "batch_ms_median": statistics.median(p["durationMs"]["triggerExecution"] for p in rest),
        "state_commit_ms_median": statistics.median(commit_ms) if commit_ms else None,
        "state_commit_ms_max": max(commit_ms) if commit_ms else None,
        "late_dropped": sum(p["stateOperators"][0].get("numRowsDroppedByWatermark", 0) for p in progress
                            if p.get("stateOperators")),
        "state_dir_bytes_end": _dir_bytes(os.path.join(root, "checkpoint", "state")),
        "wall_s": wall, "events_per_s_incl_startup": (rows_total - 1) / wall,
        "peak_rss_mb": peak, "peak_rss_by_process": rss.breakdown,
        "cpu_s": cpu, "cpu_us_per_event": 1e6 * cpu / max(1, rows_total - 1),
    }
    shutil.rmtree(root, ignore_errors=True)
    return out, got


RUNNERS = {"sparkpoint": run_sparkpoint, "spark-tws": run_spark_tws}


def workload(events: int, keys: int, epoch_records: int, event_time_per_s: int) -> W2:
    return W2(events, keys, epoch_records, event_time_per_s or max(1, keys // MEAN_CLICK_PAUSE_S))


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0])
    parser.set_defaults(events=2_000_000, keys=10_000, epoch_records=100_000, event_time_per_s=0,
                        warmup_events=200_000)
    parser.add_argument("--systems", default="sparkpoint,spark-tws")
    args = parser.parse_args()
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - set(RUNNERS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; known: {sorted(RUNNERS)}")
    w2 = workload(args.events, args.keys, args.epoch_records, args.event_time_per_s)
    rss = PeakRss()
    spark = spark_session("bench-processor")
    data = os.path.join(args.work, "data")
    files = ensure_parquet_events(spark, w2, data)
    expected = expected_sessions(files)
    if args.warmup_events:
        warm = workload(args.warmup_events, args.keys, args.epoch_records, args.event_time_per_s)
        warm_files = ensure_parquet_events(spark, warm, data)
        warm_expected = expected_sessions(warm_files)
        for system in systems:
            RUNNERS[system](spark, warm, warm_files, warm_expected, args.work, -1, rss)
    for run in range(args.first_run, args.first_run + args.runs):
        # Alternate the order run by run so drift in the machine's load hits both systems alike.
        digests = {}
        for system in (systems if run % 2 == 0 else systems[::-1]):
            result, got = RUNNERS[system](spark, w2, files, expected, args.work, run, rss)
            digests[system] = result["sessions_sha256"]
            result["loadavg_1m_after"] = os.getloadavg()[0]
            print("RESULT " + json.dumps(result), flush=True)
        if len(set(digests.values())) > 1:
            raise AssertionError(f"the systems' sessions differ: {digests}")
    rss.stop()
    spark.stop()


if __name__ == "__main__":
    main()
