"""What a small epoch costs, and who spends it: wall time per epoch and CPU per epoch of the
driver, the JVM (by thread group: JIT compilers, task threads, scheduler, GC) and Spark's
Python workers, with Spark's code-generation count and the share of subtask-epochs that
found their store still open in their Python worker (kept_stores.py).

Epochs of a few hundred records cost what every epoch costs at least: the part of an
epoch's time that does not grow with its input. The JVM is warmed by discarded runs first
(--warm epochs), since a test process or a long job runs with a warm JIT.

    python bench/epoch_fixed_cost.py [--records-per-epoch 200] [--epochs 60] [--warm 60]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import sparkpoint.runtime.graph_epoch as graph_epoch_module
from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline, Settings
from sparkpoint.runtime.jobmaster import JobMaster

from process_tree import tree_cpu_by_part
from w1_workload import spark_session


def _run(spark, epochs: int, per_epoch: int, interval: str) -> tuple[float, int]:
    root = tempfile.mkdtemp(prefix="epoch-fixed-cost-")
    try:
        source = GeneratorSource("ev", keys=50, total_events=per_epoch * epochs, max_records_per_epoch=per_epoch)
        pipeline = (Pipeline("fixed-cost").source(source)
                    .stateful(KeyedAggregate("agg", ["key"], "value", aggs=("count", "sum"), value_type="bigint"))
                    .sink(ParquetSink(os.path.join(root, "out"))))
        settings = Settings.load(overrides={
            "pipeline.name": "fixed-cost", "execution.checkpointing.dir": os.path.join(root, "chk"),
            "state.local.dir": os.path.join(root, "state"), "sparkpoint.progress": False, "rest.enabled": False,
            "execution.checkpointing.interval": interval, "sparkpoint.epoch.max-duration": 0})
        started = time.monotonic()
        result = JobMaster(pipeline, settings, spark=spark).run()
        return time.monotonic() - started, result.epochs
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records-per-epoch", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--warm", type=int, default=60, help="epochs of a discarded run first (JIT warm-up)")
    parser.add_argument("--interval", default="1 s", help="execution.checkpointing.interval")
    args = parser.parse_args()
    spark = spark_session("bench-epoch-fixed-cost")
    kept: list[bool] = []
    real_run_epoch = graph_epoch_module.run_epoch

    def counting_run_epoch(*a, **kw):
        result = real_run_epoch(*a, **kw)
        kept.extend(bool(i.get("state", {}).get("kept")) for i in result.infos.values())
        return result

    graph_epoch_module.run_epoch = counting_run_epoch
    _run(spark, args.warm, args.records_per_epoch, args.interval)
    kept.clear()
    codegen = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    compiled_before, cpu_before = codegen.getCount(), tree_cpu_by_part()
    wall, epochs = _run(spark, args.epochs, args.records_per_epoch, args.interval)
    cpu_after, compiled = tree_cpu_by_part(), codegen.getCount() - compiled_before
    per_epoch = {part: (cpu_after[part] - cpu_before.get(part, 0.0)) * 1000 / epochs for part in cpu_after}
    jvm = sum(ms for part, ms in per_epoch.items() if part.startswith("jvm: "))
    print(f"{epochs} epochs of {args.records_per_epoch} records, checkpoints every {args.interval}, "
          f"after {args.warm} warm-up epochs: {wall * 1000 / epochs:.0f} ms wall per epoch")
    print(f"CPU ms per epoch: driver {per_epoch.get('driver', 0):.0f}, JVM {jvm:.0f}, "
          f"Python workers {per_epoch.get('python workers', 0):.0f}")
    for part, ms in sorted(per_epoch.items(), key=lambda kv: -kv[1]):
        if part.startswith("jvm: ") and ms >= 2:
            print(f"  {part:<40} {ms:6.0f}")
    print(f"code generated (Janino) during the measured run: {compiled}")
    if kept:
        print(f"store kept open in the subtask's worker: {sum(kept)} of {len(kept)} subtask-epochs "
              f"({100 * statistics.mean(kept):.0f} %)")
    spark.stop()


if __name__ == "__main__":
    main()
