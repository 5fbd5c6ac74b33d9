"""W1 (keyed aggregate) workload settings shared by the sparkpoint run and its Spark
Structured Streaming peers, and the Parquet copy of the generator's events the peers read.

Both sides see the same records: the peers' files are written from
`GeneratorSource.read` for exactly the slices sparkpoint's epochs read (one file per
epoch), so `maxFilesPerTrigger=1` gives the peers the same batch sizes.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass

from sparkpoint.connectors.base import SlicePlan
from sparkpoint.connectors.generator import GeneratorSource

SPLITS = 2  # GeneratorSource splits = parallelism, as the runtime's default


@dataclass(frozen=True)
class W1:
    events: int = 5_000_000
    keys: int = 100_000
    epoch_records: int = 500_000

    def source(self) -> GeneratorSource:
        return GeneratorSource("events", keys=self.keys, splits=SPLITS, total_events=self.events,
                               max_records_per_epoch=self.epoch_records)

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


def workload_arguments(description: str):
    """The command-line options every W1 script shares; add its own, then parse_args()."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--events", type=int, default=W1.events)
    parser.add_argument("--keys", type=int, default=W1.keys)
    parser.add_argument("--epoch-records", type=int, default=W1.epoch_records)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--work", default="/tmp/sparkpoint-bench")
    parser.add_argument("--warmup-events", type=int, default=1_000_000,
                        help="a discarded run first, so the JIT and Python workers are warm for every configuration")
    parser.add_argument("--first-run", type=int, default=0, help="run number of the first run (labels only)")
    return parser


def spark_session(app: str):
    """The same embedded session sparkpoint uses (local[2], 2 shuffle partitions, AQE off)."""
    from sparkpoint.runtime.spark import get_or_create_spark

    return get_or_create_spark("local[2]", app, 2)


def ensure_parquet_events(spark, w1: W1, root: str) -> str:
    """Write the events once per workload into `root/<w1 settings>/files`; reuse after."""
    base = os.path.join(root, f"w1-{w1.events}-{w1.keys}-{w1.epoch_records}")
    files, marker = os.path.join(base, "files"), os.path.join(base, "complete.json")
    if os.path.exists(marker):
        return files
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(files)
    src = w1.source()
    from sparkpoint.connectors.base import SourceContext

    src.open(SourceContext(spark, "w1-data"))
    for i, plan in enumerate(w1.slices()):
        tmp = os.path.join(base, f"tmp-{i}")
        src.read(plan).select("key", "value", "ts").coalesce(1).write.parquet(tmp)
        part = next(n for n in os.listdir(tmp) if n.endswith(".parquet"))
        target = os.path.join(files, f"epoch-{i:05d}.parquet")
        os.replace(os.path.join(tmp, part), target)
        # The file source orders new files by modification time: make it the epoch order.
        os.utime(target, (1_700_000_000 + i, 1_700_000_000 + i))
        shutil.rmtree(tmp)
    with open(marker, "w") as f:
        json.dump(asdict(w1), f)
    return files
