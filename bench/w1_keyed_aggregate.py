"""W1 on sparkpoint: KeyedAggregate(count, sum) over K keys, parallelism 2, in-process
JobMaster, checkpoints OFF and every 1 s on the same data in the same process.

    python bench/w1_keyed_aggregate.py [--events 5000000] [--keys 100000]
        [--epoch-records 500000] [--modes off,on,on-parquet,on-timed] [--epoch-target 500ms]
        [--runs 1] [--work /tmp/sparkpoint-bench]

Modes: off / on read GeneratorSource (events computed by Spark: three xxhash64 per event);
on-parquet reads the Parquet files the Spark SS peer reads, with FileSource, one file per
epoch: the like-for-like comparison with Spark SS; on-timed is `on` with epochs sized by
time (`sparkpoint.epoch.target-duration` = --epoch-target; --epoch-records stays the cap).

Prints one JSON line per run (prefixed `RESULT `) with events/s after start-up
(from the end of epoch 0 to the end of the last epoch with data: excludes Spark
warm-up, the final empty epoch and the final checkpoint), checkpoint p50/p99 and
bytes per checkpoint. Checkpoint storage is a local directory.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from typing import Any

from sparkpoint.api import KeyedAggregate
from sparkpoint.api.pipeline import Pipeline
from sparkpoint.config import Settings
from sparkpoint.connectors.files import FileSource
from sparkpoint.connectors.parquet_sink import ParquetSink
from sparkpoint.runtime.jobmaster import JobMaster

from w1_workload import W1, ensure_parquet_events, spark_session, workload_arguments
from process_tree import PeakRss, tree_cpu_s


class MeasuredJobMaster(JobMaster):
    """Records when each epoch ends and what each completed checkpoint cost; the job
    itself runs unchanged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epoch_ends: list[tuple[float, int, int]] = []  # (monotonic s, epoch, records so far)
        self.checkpoints: list[tuple[int, int]] = []  # (duration ms, bytes)

    def _setup(self) -> None:
        super()._setup()
        stats = self.coordinator.stats
        report = stats.report_completed

        def recording(checkpoint_id: int, duration_ms: int, size_bytes: int, completed_at_ms: int) -> None:
            self.checkpoints.append((duration_ms, size_bytes))
            report(checkpoint_id, duration_ms, size_bytes, completed_at_ms)

        stats.report_completed = recording

    def _run_one_epoch(self, plan, final: bool) -> None:
        records_before = self.records
        super()._run_one_epoch(plan, final)
        if self.records > records_before:  # an epoch with data (not the final empty ones)
            self.epoch_ends.append((time.monotonic(), self.epoch, self.records))


def run_once(spark, w1: W1, mode: str, work: str, run: int, epoch_target: str = "500 ms") -> dict[str, Any]:
    """mode: off / on (checkpoints every 1 s), the events from GeneratorSource; on-parquet:
    checkpoints on, the events read by FileSource from the Parquet files the Spark SS peer
    reads (one file per epoch), so both pay the same to get their input."""
    name = f"w1-{mode}-{run}"
    root = os.path.join(work, name)
    shutil.rmtree(root, ignore_errors=True)
    if mode == "on-parquet":
        files = ensure_parquet_events(spark, w1, os.path.join(work, "data"))
        source = FileSource(files, format="parquet", schema="key BIGINT, value BIGINT, ts BIGINT", name="events",
                            max_files_per_epoch=1, bounded=True)
    else:
        source = w1.source()
    pipeline = (Pipeline(name).source(source)
                .stateful(KeyedAggregate("w1", ["key"], "value", aggs=("count", "sum"), value_type="bigint"))
                .sink(ParquetSink(os.path.join(root, "output"))))
    settings = Settings.load(overrides={
        "pipeline.name": name,
        "parallelism.default": 2,
        "execution.checkpointing.dir": os.path.join(root, "checkpoints"),
        "execution.checkpointing.enabled": mode != "off",
        "execution.checkpointing.interval": "1 s",
        "state.local.dir": os.path.join(root, "state"),
        "sparkpoint.progress": False,
        "sparkpoint.epoch.target-duration": epoch_target if mode == "on-timed" else 0,
    })
    job = MeasuredJobMaster(pipeline, settings, spark=spark)
    started, cpu0 = time.monotonic(), tree_cpu_s()
    result = job.run()
    wall, cpu = time.monotonic() - started, tree_cpu_s() - cpu0
    (t0, _, r0), (t1, _, r1) = job.epoch_ends[0], job.epoch_ends[-1]
    epoch_s = [b[0] - a[0] for a, b in zip(job.epoch_ends, job.epoch_ends[1:])]
    sizes = [b for _, b in job.checkpoints]
    stats = job.coordinator.stats.snapshot()
    out = {
        "system": "sparkpoint", "config": f"ckpt-{mode}", "run": run, "events": result.records,
        "keys": w1.keys, "epoch_records": w1.epoch_records, "epochs_with_data": len(job.epoch_ends),
        "epoch_target": epoch_target if mode == "on-timed" else None,
        "events_per_s": (r1 - r0) / (t1 - t0),
        "wall_s": wall, "events_per_s_incl_startup": result.records / wall,
        # CPU of the process tree (driver, JVM, Python workers) over the whole run.
        "cpu_s": cpu, "cpu_us_per_event": 1e6 * cpu / max(1, result.records),
        "epoch_s_median": statistics.median(epoch_s) if epoch_s else None,
        "checkpoints_completed": len(job.checkpoints), "checkpoints_failed": int(stats.get("failed", 0)),
        "ckpt_failures_by_reason": stats.get("failures_by_reason", {}),
        "ckpt_p50_ms": stats.get("duration_p50_ms"), "ckpt_p99_ms": stats.get("duration_p99_ms"),
        "ckpt_bytes_median": statistics.median(sizes) if sizes else None,
        "ckpt_bytes_max": max(sizes) if sizes else None,
        "status": result.status.value,
    }
    shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0])
    parser.add_argument("--modes", default="off,on,on-parquet,on-timed")
    parser.add_argument("--epoch-target", default="500 ms", help="sparkpoint.epoch.target-duration of on-timed")
    args = parser.parse_args()
    w1 = W1(args.events, args.keys, args.epoch_records)
    spark = spark_session("bench-w1-sparkpoint")
    if args.warmup_events:
        run_once(spark, W1(args.warmup_events, args.keys, args.epoch_records), "on", args.work, -1)
    modes = args.modes.split(",")
    # Peak memory of this process tree (driver, JVM, Python workers) as PSS, like W2's.
    rss = PeakRss()
    for run in range(args.first_run, args.first_run + args.runs):
        # Alternate the order run by run so drift in the machine's load hits every mode alike.
        for mode in (modes if run % 2 == 0 else modes[::-1]):
            rss.reset()
            result = run_once(spark, w1, mode, args.work, run, args.epoch_target)
            result["peak_rss_mb"], result["peak_rss_by_process"] = rss.peak_mb, rss.breakdown
            result["loadavg_1m_after"] = os.getloadavg()[0]
            print("RESULT " + json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
