"""W2 on sparkpoint: 60 s event-time tumbling windows, count per key, watermark 5 s behind
the max event time, parallelism 2, in-process JobMaster, checkpoints OFF and every 1 s on
the same data in the same process; `--window sliding|session` runs its variants.

    python bench/w2_window.py [--events 5000000] [--keys 100000] [--epoch-records 500000]
        [--event-time-per-s 5000] [--modes off,on] [--runs 1] [--work /tmp/sparkpoint-bench]
        [--window tumbling|sliding|session] [--slide-s 10] [--gap-s 30]

Pipeline: GeneratorSource → .watermark("ts", delay="5 s") →
TumblingWindow("w2", ["key"], "ts", size="60 s") → ParquetSink. At the end of the
bounded input the final epoch fires every window still open. The variants (sections
w2-sliding, w2-session; bench/w2_windows.py says why these sizes) replace the step with
SlidingWindow("w2", ["key"], "ts", size="60 s", slide="10 s") or
SessionWindow("w2", ["key"], "ts", gap="30 s"), count per window, final output mode.

Prints one JSON line per run (prefixed `RESULT `): events/s after start-up = events
after epoch 0 divided by the time from the end of epoch 0 to the end of the final epoch
(the one that fires the last windows; the final checkpoint after it is excluded),
checkpoint p50/p99 and bytes, output_rows (committed rows, asserted equal to the
distinct (window, key) pairs of the input, or to its sessions, computed apart from the
run), and peak_rss_mb of the process tree.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from typing import Any

from sparkpoint.api.pipeline import Pipeline
from sparkpoint.config import Settings
from sparkpoint.connectors.parquet_sink import ParquetSink, read_committed
from sparkpoint.runtime.jobmaster import JobMaster

import w2_windows
from w2_windows import Windowing
from process_tree import PeakRss, tree_cpu_s
from w2_workload import (DELAY_MS, W2, expected_output_rows, from_args, spark_session,
                         workload_arguments)


class MeasuredJobMaster(JobMaster):
    """Records when each epoch ends and what each completed checkpoint cost."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epoch_ends: list[tuple[float, int, int]] = []  # (monotonic s, epoch, records so far)
        self.final_end: float | None = None  # end of the first final epoch (fires every open window)
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
        if self.records > records_before:
            self.epoch_ends.append((time.monotonic(), self.epoch, self.records))
        elif final and self.final_end is None:
            self.final_end = time.monotonic()


def run_once(spark, w2: W2, mode: str, work: str, run: int, rss: PeakRss,
             windowing: Windowing = Windowing()) -> dict[str, Any]:
    name = f"{windowing.workload}-{mode}-{run}"
    root = os.path.join(work, name)
    shutil.rmtree(root, ignore_errors=True)
    expected = expected_output_rows(spark, w2, os.path.join(work, "data"), windowing)
    out_dir = os.path.join(root, "output")
    pipeline = (Pipeline(name).source(w2.source())
                .watermark("ts", delay=f"{DELAY_MS // 1000} s")
                .stateful(windowing.sparkpoint_step("w2"))
                .sink(ParquetSink(out_dir)))
    settings = Settings.load(overrides={
        "pipeline.name": name,
        "parallelism.default": 2,
        "execution.checkpointing.dir": os.path.join(root, "checkpoints"),
        "execution.checkpointing.enabled": mode == "on",
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
    output_rows = read_committed(out_dir).num_rows
    if output_rows != expected["output_rows"]:
        raise AssertionError(f"sparkpoint {windowing.workload} ({mode}) committed {output_rows} rows, expected "
                             f"{expected['output_rows']} (the input's distinct window × key pairs, or its sessions)")
    (t0, _, r0), (t_last, _, r1) = job.epoch_ends[0], job.epoch_ends[-1]
    t1 = job.final_end or t_last
    epoch_s = [b[0] - a[0] for a, b in zip(job.epoch_ends, job.epoch_ends[1:])]
    sizes = [b for _, b in job.checkpoints]
    stats = job.coordinator.stats.snapshot()
    out = {
        "system": "sparkpoint", "config": f"ckpt-{mode}", "workload": windowing.workload, "run": run,
        "events": result.records,
        "keys": w2.keys, "epoch_records": w2.epoch_records, "event_time_per_s": w2.event_time_per_s,
        **windowing.fields(), "windows": expected["windows"], "output_rows": output_rows,
        "epochs_with_data": len(job.epoch_ends),
        "events_per_s": (r1 - r0) / (t1 - t0),
        "wall_s": wall, "events_per_s_incl_startup": result.records / wall,
        "epoch_s_median": statistics.median(epoch_s) if epoch_s else None,
        "final_fire_s": (job.final_end - t_last) if job.final_end else None,
        "checkpoints_completed": len(job.checkpoints), "checkpoints_failed": int(stats.get("failed", 0)),
        "ckpt_failures_by_reason": stats.get("failures_by_reason", {}),
        "ckpt_p50_ms": stats.get("duration_p50_ms"), "ckpt_p99_ms": stats.get("duration_p99_ms"),
        "ckpt_bytes_median": statistics.median(sizes) if sizes else None,
        "ckpt_bytes_max": max(sizes) if sizes else None,
        "late_dropped": job.late_dropped,
        "peak_rss_mb": peak, "peak_rss_by_process": rss.breakdown,
        "cpu_s": cpu, "cpu_us_per_event": 1e6 * cpu / max(1, result.records),
        "status": result.status.value,
    }
    shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0])
    parser.add_argument("--modes", default="off,on")
    args = parser.parse_args()
    w2, windowing = from_args(args), w2_windows.from_args(args)
    rss = PeakRss()
    spark = spark_session(f"bench-{windowing.workload}-sparkpoint")
    if args.warmup_events:
        warm = W2(args.warmup_events, args.keys, args.epoch_records, args.event_time_per_s)
        run_once(spark, warm, "on", args.work, -1, rss, windowing)
    modes = args.modes.split(",")
    for run in range(args.first_run, args.first_run + args.runs):
        # Alternate the order run by run so drift in the machine's load hits every mode alike.
        for mode in (modes if run % 2 == 0 else modes[::-1]):
            result = run_once(spark, w2, mode, args.work, run, rss, windowing)
            result["loadavg_1m_after"] = os.getloadavg()[0]
            print("RESULT " + json.dumps(result), flush=True)
    rss.stop()
    spark.stop()


if __name__ == "__main__":
    main()
