"""Where one sparkpoint W1 (or, with --workload w2, W2) epoch's time goes: the Spark job (`run_epoch`, of which the
subtasks' state apply inside the Python workers), the sink write, and the driver's
snapshot start. Checkpoints every 1 s; one process; prints a per-epoch table.

    python bench/w1_epoch_profile.py [--events 3000000] [--keys 100000] [--epoch-records 500000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time

import sparkpoint.runtime.graph_epoch as graph_epoch_module
import sparkpoint.runtime.jobmaster as jobmaster_module
from sparkpoint.api import KeyedAggregate, TumblingWindow
from sparkpoint.api.pipeline import Pipeline
from sparkpoint.config import Settings
from sparkpoint.connectors.parquet_sink import ParquetSink

from w1_workload import W1, spark_session
from w2_workload import DELAY_MS, W2, WINDOW_MS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=3_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--epoch-records", type=int, default=500_000)
    parser.add_argument("--checkpoints", choices=["on", "off"], default="on")
    parser.add_argument("--workload", choices=["w1", "w2"], default="w1",
                        help="w2: the W2 pipeline (60 s tumbling windows, watermark 5 s) on the same epochs")
    parser.add_argument("--work", default="/tmp/sparkpoint-bench")
    args = parser.parse_args()
    w1 = W1(args.events, args.keys, args.epoch_records)
    spark = spark_session("bench-w1-profile")
    rows: list[dict[str, float]] = []
    phases: list[dict] = []  # per subtask-epoch: where the task's time went (EpochTask.run's phase_ms)
    real_run_epoch = graph_epoch_module.run_epoch  # each stateful step's Spark job

    def timed_run_epoch(*a, **kw):
        t0 = time.perf_counter()
        result = real_run_epoch(*a, **kw)
        for info in result.infos.values():
            phases.append({**info.get("phase_ms", {}), "kept": bool(info.get("state", {}).get("kept"))})
        kept = sum(bool(i.get("state", {}).get("kept")) for i in result.infos.values())
        rows.append({"epoch": a[5], "run_epoch_s": time.perf_counter() - t0,
                     "subtask_max_s": max(result.subtask_ms.values(), default=0) / 1000,
                     "subtask_sum_s": sum(result.subtask_ms.values()) / 1000, "records": result.input_records,
                     "kept": kept})
        return result

    timings = {"read_s": 0.0, "sink_s": 0.0}

    def timed(fn, key):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timings[key] += time.perf_counter() - t0
        return wrapper

    class ProfiledJobMaster(jobmaster_module.JobMaster):
        def _setup(self) -> None:
            super()._setup()
            for source in self.sources.values():
                source.read = timed(source.read, "read_s")  # builds the slice's DataFrame (py4j calls)
            for sink in self.sinks.values():
                sink.write_epoch = timed(sink.write_epoch, "sink_s")

        def _run_one_epoch(self, plan, final: bool) -> None:
            timings.update(read_s=0.0, sink_s=0.0)
            t0 = time.perf_counter()
            super()._run_one_epoch(plan, final)
            if rows:
                rows[-1].update(epoch_total_s=time.perf_counter() - t0, **timings)

    graph_epoch_module.run_epoch = timed_run_epoch
    root = os.path.join(args.work, "profile")
    shutil.rmtree(root, ignore_errors=True)
    if args.workload == "w1":
        pipeline = (Pipeline("w1-profile").source(w1.source())
                    .stateful(KeyedAggregate("w1", ["key"], "value", aggs=("count", "sum"), value_type="bigint"))
                    .sink(ParquetSink(os.path.join(root, "output"))))
    else:
        w2 = W2(args.events, args.keys, args.epoch_records)
        pipeline = (Pipeline("w1-profile").source(w2.source())
                    .watermark("ts", delay=f"{DELAY_MS // 1000} s")
                    .stateful(TumblingWindow("w2", ["key"], "ts", size=f"{WINDOW_MS // 1000} s"))
                    .sink(ParquetSink(os.path.join(root, "output"))))
    settings = Settings.load(overrides={
        "pipeline.name": "w1-profile", "execution.checkpointing.dir": os.path.join(root, "checkpoints"),
        "execution.checkpointing.enabled": args.checkpoints == "on", "execution.checkpointing.interval": "1 s",
        "state.local.dir": os.path.join(root, "state"), "sparkpoint.progress": False})
    ProfiledJobMaster(pipeline, settings, spark=spark).run()
    print(f"{'epoch':>5} {'records':>9} {'epoch s':>8} {'run_epoch s':>11} {'subtask max s':>13} "
          f"{'subtask sum s':>13} {'driver rest s':>13} {'of it: read s':>13} {'sink s':>7} {'kept':>5}")
    for r in rows:
        rest = r.get("epoch_total_s", 0) - r["run_epoch_s"]
        print(f"{r['epoch']:>5} {r['records']:>9,} {r.get('epoch_total_s', 0):>8.2f} {r['run_epoch_s']:>11.2f} "
              f"{r['subtask_max_s']:>13.2f} {r['subtask_sum_s']:>13.2f} {rest:>13.3f} {r.get('read_s', 0):>13.3f} "
              f"{r.get('sink_s', 0):>7.3f} {r['kept']:>5}")
    steady = [r for r in rows[1:] if r["records"]]
    if steady:
        print("median after epoch 0: epoch %.2f s, run_epoch %.2f s, subtask max %.2f s" % (
            statistics.median(r.get("epoch_total_s", 0) for r in steady),
            statistics.median(r["run_epoch_s"] for r in steady),
            statistics.median(r["subtask_max_s"] for r in steady)))
    steady_phases = phases[2 * 2:]  # after epoch 0 and 1 (start-up, first snapshot)
    for kept in (True, False):
        group = [p for p in steady_phases if p["kept"] == kept]
        if group:
            names = [k for k in group[0] if k != "kept"]
            print(f"subtask phases, store {'kept open' if kept else 'opened'} ({len(group)} subtask-epochs), median ms: "
                  + ", ".join(f"{n} {statistics.median(p.get(n, 0) for p in group):.0f}" for n in names))
    shutil.rmtree(root, ignore_errors=True)
    spark.stop()


if __name__ == "__main__":
    main()
