"""W2 (event-time tumbling windows) workload settings shared by the sparkpoint run and its
Spark Structured Streaming peer, the Parquet copy of the generator's events the peer
reads, and the expected output size (CPU and memory of the process tree: bench/process_tree.py).

Events: the records of `GeneratorSource(seed=7, splits=2)` (keys uniform over K, value
0..999) with event time advancing `event_time_per_s` events per second of event time
(default 5,000: 5 M events span 1,000 s of event time, 17 windows of 60 s), disorder up
to 2 s (the generator's default, below the 5 s watermark delay: no row is late).
Per (60 s window, key): count(*). Watermark = max event time seen − 5 s.

Equal work: sparkpoint's bounded run fires every window at the end of the input (final
watermark); Spark SS in append mode only emits windows whose end is ≤ its watermark, so
its input gets one extra one-row file after the events (key −1, event time past the
last window end + the delay) whose only effect is to advance the watermark so every real
window is emitted; the sentinel's own window is never emitted. Both systems must then
emit exactly `expected_output_rows` rows = the distinct (window, key) pairs of the input
(the sliding and session variants: see bench/w2_windows.py). The same events and files
serve all three window kinds.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass

from sparkpoint.connectors.base import SlicePlan, SourceContext
from sparkpoint.connectors.generator import GeneratorSource
import w2_windows
from w2_windows import WINDOW_MS, Windowing, expected_rows

SPLITS = 2
DELAY_MS = 5_000
START_TS_MS = 1_700_000_000_000  # the generator's default


@dataclass(frozen=True)
class W2:
    events: int = 5_000_000
    keys: int = 100_000
    epoch_records: int = 500_000
    event_time_per_s: int = 5_000

    def source(self) -> GeneratorSource:
        return GeneratorSource("events", keys=self.keys, splits=SPLITS, total_events=self.events,
                               max_records_per_epoch=self.epoch_records, start_ts_ms=START_TS_MS,
                               event_time_per_s=self.event_time_per_s)

    def slices(self) -> list[SlicePlan]:
        """The plans sparkpoint's epochs read, in order (no rate limit: budget-bound)."""
        src = self.source()
        positions = src.initial_positions()
        plans = []
        while not src.is_exhausted(positions):
            plan = src.plan(positions)
            plans.append(plan)
            positions = dict(plan.end)
        return plans

    @property
    def tag(self) -> str:
        return f"w2-{self.events}-{self.keys}-{self.epoch_records}-{self.event_time_per_s}"


def workload_arguments(description: str):
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--events", type=int, default=W2.events)
    parser.add_argument("--keys", type=int, default=W2.keys)
    parser.add_argument("--epoch-records", type=int, default=W2.epoch_records)
    parser.add_argument("--event-time-per-s", type=int, default=W2.event_time_per_s,
                        help="events per second of event time (5 M events at 5,000/s span 17 windows of 60 s)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--work", default="/tmp/sparkpoint-bench")
    parser.add_argument("--warmup-events", type=int, default=1_000_000,
                        help="a discarded run first, so the JIT and Python workers are warm for every configuration")
    parser.add_argument("--first-run", type=int, default=0, help="run number of the first run (labels only)")
    w2_windows.add_arguments(parser)
    return parser


def from_args(args) -> W2:
    return W2(args.events, args.keys, args.epoch_records, args.event_time_per_s)


def spark_session(app: str):
    """The same embedded session sparkpoint uses (local[2], 2 shuffle partitions, AQE off)."""
    from sparkpoint.runtime.spark import get_or_create_spark

    return get_or_create_spark("local[2]", app, 2)


def _all_events(spark, w2: W2):
    src = w2.source()
    src.open(SourceContext(spark, "w2-data"))
    plan = SlicePlan(src.initial_positions(), {str(s): src._split_total(s) for s in range(SPLITS)})
    return src.read(plan)


def expected_output_rows(spark, w2: W2, root: str, windowing: Windowing = Windowing()) -> dict:
    """{output_rows, windows, max_ts}: distinct (window, key) pairs of the input, by a
    Spark batch query over the same generator records (sliding and session windows:
    bench/w2_windows.py, with numpy); cached under `root`."""
    from pyspark.sql import functions as F

    if windowing.kind != "tumbling":
        return expected_rows(w2, windowing, root, _all_events(spark, w2))
    path = os.path.join(root, w2.tag + "-expected.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    df = _all_events(spark, w2).select("key", (F.floor(F.col("ts") / WINDOW_MS)).alias("w"), "ts")
    row = df.agg(F.count_distinct("key", "w").alias("rows"), F.count_distinct("w").alias("windows"),
                 F.max("ts").alias("max_ts"), F.min("ts").alias("min_ts")).first()
    out = {"output_rows": int(row["rows"]), "windows": int(row["windows"]), "max_ts": int(row["max_ts"]),
           "min_ts": int(row["min_ts"])}
    os.makedirs(root, exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f)
    return out


def ensure_parquet_events(spark, w2: W2, root: str) -> str:
    """The events as Parquet, one file per sparkpoint epoch, plus the watermark sentinel
    as the last file; written once per workload into `root/<tag>/files`."""
    base = os.path.join(root, w2.tag)
    files, marker = os.path.join(base, "files"), os.path.join(base, "complete.json")
    if os.path.exists(marker):
        return files
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(files)
    src = w2.source()
    src.open(SourceContext(spark, "w2-data"))
    plans = w2.slices()
    for i, plan in enumerate(plans):
        _write_one(src.read(plan).select("key", "value", "ts"), base, files, i)
    expected = expected_output_rows(spark, w2, root)
    last_end = (expected["max_ts"] // WINDOW_MS + 1) * WINDOW_MS
    sentinel = spark.createDataFrame([(-1, 0, last_end + DELAY_MS + WINDOW_MS)], "key BIGINT, value BIGINT, ts BIGINT")
    _write_one(sentinel, base, files, len(plans))
    with open(marker, "w") as f:
        json.dump(asdict(w2), f)
    return files


def _write_one(df, base: str, files: str, i: int) -> None:
    tmp = os.path.join(base, f"tmp-{i}")
    df.coalesce(1).write.parquet(tmp)
    part = next(n for n in os.listdir(tmp) if n.endswith(".parquet"))
    target = os.path.join(files, f"epoch-{i:05d}.parquet")
    os.replace(os.path.join(tmp, part), target)
    # The file source orders new files by modification time: make it the epoch order.
    os.utime(target, (1_700_000_000 + i, 1_700_000_000 + i))
    shutil.rmtree(tmp)
