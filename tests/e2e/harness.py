"""Run pipelines as real `sparkpoint run` subprocesses, kill them with SIGKILL,
and compare committed output with a failure-free reference run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

REPO = Path(__file__).resolve().parents[2]

WINDOW_PIPELINE = """
from sparkpoint import GeneratorSource, ParquetSink, Pipeline, TumblingWindow
pipeline = (
    Pipeline("{job}")
    .source(GeneratorSource("events", keys={keys}, total_events={total}, max_records_per_epoch={per_epoch},
                            splits=2, disorder_ms=1_000))
    .transform(lambda df: df.where("value >= 0"))
    .watermark("ts", delay="2 s")
    .stateful(TumblingWindow("windows", ["key"], "ts", size="2 s", aggs=("count", "sum"), value_column="value",
                             value_type="bigint"))
    .sink(ParquetSink(r"{out}"))
)
"""

AGGREGATE_PIPELINE = """
from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline
pipeline = (
    Pipeline("{job}")
    .source(GeneratorSource("events", keys={keys}, total_events={total}, max_records_per_epoch={per_epoch}))
    .stateful(KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
    .sink(ParquetSink(r"{out}"))
)
"""


@dataclass
class Job:
    """One pipeline with its directories; `run()` / `start()` launch real processes."""

    root: Path
    name: str = "e2e"
    template: str = WINDOW_PIPELINE
    keys: int = 200
    total: int = 300_000
    per_epoch: int = 20_000
    checkpoint_dir: str | None = None
    sets: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.out = self.root / "out"
        self.file = self.root / f"{self.name}_pipeline.py"
        self.file.write_text(self.template.format(job=self.name, keys=self.keys, total=self.total,
                                                  per_epoch=self.per_epoch, out=self.out))

    def args(self, extra: list[str] | None = None) -> list[str]:
        sets = [
            f"execution.checkpointing.dir={self.checkpoint_dir or self.root / 'checkpoints'}",
            f"state.local.dir={self.root / 'state'}",
            "execution.checkpointing.interval=1 s",
            "sparkpoint.lease.ttl=4 s",
            "restart-strategy.type=fixed-delay",
            "restart-strategy.fixed-delay.delay=200 ms",
            "parallelism.default=2",
            # Epochs are never cut by time: update-mode oracles (chaos_oracles.aggregate_updates)
            # fold fixed-size epochs, and on a loaded machine an epoch can outlast the sizer's
            # ceiling (a quarter of the checkpoint timeout), which cuts the next ones smaller.
            "sparkpoint.epoch.max-duration=0",
            *self.sets,
            *(extra or []),
        ]
        cmd = [sys.executable, "-m", "sparkpoint.ops.cli", "--log-level", "INFO", "run", str(self.file)]
        for s in sets:
            cmd += ["--set", s]
        return cmd

    def start(self, extra: list[str] | None = None) -> "Proc":
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1")
        p = subprocess.Popen(self.args(extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             cwd=self.root, env=env, start_new_session=True)
        return Proc(p)

    def run(self, extra: list[str] | None = None, timeout: float = 300) -> "Proc":
        proc = self.start(extra)
        proc.wait(timeout)
        return proc

    def output(self) -> pa.Table:
        return read_output(self.out)


def read_output(path: Path) -> pa.Table:
    """Committed output only (the `_staging` directory is ignored, like Spark does)."""
    if not path.exists():
        return pa.table({})
    dataset = ds.dataset(str(path), format="parquet", partitioning="hive",
                         exclude_invalid_files=True, ignore_prefixes=["_", "."])
    table = dataset.to_table()
    return table


def canonical(table: pa.Table, drop: tuple[str, ...] = ("epoch",)) -> list[tuple]:
    cols = [c for c in table.column_names if c not in drop]
    rows = table.select(cols).to_pylist()
    return sorted(tuple(r[c] for c in cols) for r in rows)


class Proc:
    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def tail(self, n: int = 60) -> str:
        """The last `n` lines the job itself wrote (librdkafka's own '%' lines left out)."""
        return "\n".join([line for line in self.lines if not line.startswith("%")][-n:])

    def wait_for(self, pattern: str, timeout: float = 120, start_at: int = 0) -> re.Match:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            i = start_at
            while True:
                while i < len(self.lines):
                    m = rx.search(self.lines[i])
                    if m:
                        return m
                    i += 1
                if self.popen.poll() is not None and i >= len(self.lines):
                    self._cond.wait(0.2)
                    if i >= len(self.lines):
                        raise AssertionError(f"process exited ({self.popen.returncode}) before /{pattern}/:\n"
                                             + self.tail())
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for /{pattern}/:\n" + self.tail())
                self._cond.wait(min(left, 0.5))

    def count(self, pattern: str) -> int:
        rx = re.compile(pattern)
        with self._cond:
            return sum(1 for line in self.lines if rx.search(line))

    def kill9(self) -> None:
        """SIGKILL the whole process group: the driver JVM and Python workers die too."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(30)
        self._reader.join(10)

    def wait(self, timeout: float = 300) -> int:
        try:
            rc = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise AssertionError("pipeline did not finish in time:\n" + "\n".join(self.lines[-80:]))
        self._reader.join(10)
        return rc
