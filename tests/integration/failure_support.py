"""Shared pieces of the checkpoint-failure rehearsals (tests/integration/test_failure_paths.py
and tests/integration/test_crash_restore.py): one windowed pipeline, its exact expected output,
and a JobMaster that records what a user would observe."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkpoint import GeneratorSource, ParquetSink, Pipeline, Settings, TumblingWindow
from sparkpoint.checkpoint.alarms import CheckpointFailureEvent
from sparkpoint.checkpoint.reasons import CheckpointFailureReason
from sparkpoint.faults import FaultyStorageFS
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.storage.layout import checkpoint_id_in_path

WINDOW_MS = 2_000


@dataclass(frozen=True)
class Events:
    """The generated input. Window output (count and sum per key and 2 s window) does not
    depend on epoch boundaries, so any run, with or without failures, must produce
    exactly the rows of `expected_windows`."""

    keys: int = 200
    total: int = 60_000
    per_epoch: int = 4_000
    splits: int = 2
    disorder_ms: int = 1_000
    # Paces the input, so a run spans a number of checkpoint intervals however fast
    # the machine runs epochs (the output does not depend on epoch sizes).
    rate_per_s: float | None = None

    def source(self) -> GeneratorSource:
        return GeneratorSource("events", keys=self.keys, total_events=self.total,
                               max_records_per_epoch=self.per_epoch, splits=self.splits,
                               disorder_ms=self.disorder_ms, rate_per_s=self.rate_per_s)

    def pipeline(self, name: str, out: Path, transform: Any = None) -> Pipeline:
        """`transform`: a stateless step before the window (e.g. a `Tripwire`)."""
        pipeline = Pipeline(name).source(self.source())
        if transform is not None:
            pipeline = pipeline.transform(transform)
        return (pipeline
                .watermark("ts", delay="2 s")
                .stateful(TumblingWindow("windows", ["key"], "ts", size_ms=WINDOW_MS, aggs=("count", "sum"),
                                         value_column="value", value_type="bigint"))
                .sink(ParquetSink(str(out))))


class Tripped(Exception):
    pass


class Tripwire:
    """A stateless step that passes the rows on, except once after `arm()`: then it
    raises on the driver while the epoch is being built, an epoch failure like any other
    (a failover follows). Armed before the run: the first epoch fails."""

    def __init__(self) -> None:
        self._armed = threading.Event()

    def arm(self) -> None:
        self._armed.set()

    def __call__(self, df):
        if self._armed.is_set():
            self._armed.clear()
            raise Tripped("tripwire: this epoch fails once")
        return df


def expected_windows(spark, events: Events) -> list[tuple]:
    """The failure-free answer, computed in one batch over every event: the same rows a
    failure-free streaming run commits (the watermark delay exceeds the disorder, so no
    event is late), sorted like `tests.e2e.harness.canonical`."""
    from pyspark.sql import functions as F

    from sparkpoint.connectors.base import SlicePlan, SourceContext

    source = events.source()
    source.open(SourceContext(spark, "oracle"))
    start = source.initial_positions()
    end = {split: source._split_total(int(split)) for split in start}
    rows = (source.read(SlicePlan(start, end))
            .withColumn("window_start", F.col("ts") - F.pmod("ts", F.lit(WINDOW_MS)))
            .groupBy("key", "window_start")
            .agg(F.count(F.lit(1)).alias("count"), F.sum("value").alias("sum"))
            .select("key", "window_start", (F.col("window_start") + WINDOW_MS).alias("window_end"), "count", "sum")
            .collect())
    return sorted(tuple(r) for r in rows)


def settings(root: Path, name: str, faults: list[dict[str, Any]], **extra: Any) -> Settings:
    return Settings.load(overrides={
        "pipeline.name": name,
        "execution.checkpointing.dir": str(root / "checkpoints"),
        "state.local.dir": str(root / "state"),
        "execution.checkpointing.interval": "1 s",
        "parallelism.default": 2,
        "sparkpoint.progress": False,
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.delay": "100 ms",
        "sparkpoint.faults": faults,
        # Epochs are never cut by time: the oracles fold epochs of the sources' own sizes, and
        # on a loaded machine an epoch can outlast the sizer's ceiling, which cuts the next ones.
        "sparkpoint.epoch.max-duration": 0,
        # The tests take savepoints into their own temporary directory, beside the checkpoints.
        "execution.checkpointing.savepoint.allowed-targets": [str(root)],
        **extra,
    })


class ObservedJob(JobMaster):
    """A JobMaster that keeps the alarm events and the ids of completed checkpoints."""

    def _setup(self) -> None:
        super()._setup()
        self.alarms: list[CheckpointFailureEvent] = []
        self.completed_ids: list[int] = []
        # checkpoint id -> when its first failure was reported (same clock as RecordingStorageFS)
        self.first_failure_seq: dict[int | None, int] = {}
        self.coordinator.alarms.register(self._on_alarm)

    def _on_alarm(self, event: CheckpointFailureEvent) -> None:
        self.first_failure_seq.setdefault(event.checkpoint_id, next_seq())
        self.alarms.append(event)

    def _on_checkpoint_complete(self, checkpoint_id, data) -> None:
        self.completed_ids.append(checkpoint_id)
        super()._on_checkpoint_complete(checkpoint_id, data)

    def failures(self, checkpoint_id: int) -> list[CheckpointFailureEvent]:
        return [e for e in self.alarms if e.checkpoint_id == checkpoint_id]

    def counted(self) -> list[CheckpointFailureEvent]:
        return [e for e in self.alarms if e.counted]

    def reasons(self) -> dict[str, int]:
        """Every failure and refusal by reason, including "not now" ones (no alarm)."""
        return dict(self.coordinator.stats.snapshot()["failures_by_reason"])

    def counted_reasons(self) -> set[CheckpointFailureReason]:
        return {e.reason for e in self.counted()}


# -- storage operations in the order they really happened --------------------------------
_sequence = itertools.count()
_sequence_lock = threading.Lock()


def next_seq() -> int:
    with _sequence_lock:
        return next(_sequence)


@dataclass(frozen=True)
class StorageOp:
    seq: int
    kind: str  # "wrote" (after the write finished) or "delete" (before the delete started)
    path: str

    @property
    def checkpoint_id(self) -> int | None:
        return checkpoint_id_in_path(self.path)


class RecordingStorageFS(FaultyStorageFS):
    """Records when each write *finished* and when each delete *started*, so a test can
    prove no write into a checkpoint directory landed after that directory was deleted
    (seed 000). Install with monkeypatch on `sparkpoint.faults.FaultyStorageFS`;
    the runtime builds it whenever `sparkpoint.faults` holds a storage rule."""

    log: list[StorageOp] = []

    def _record(self, kind: str, path: str) -> None:
        RecordingStorageFS.log.append(StorageOp(next_seq(), kind, path))

    def put_file(self, local_path: str, path: str) -> None:
        super().put_file(local_path, path)
        self._record("wrote", path)

    def write_atomic(self, path: str, data: bytes) -> None:
        super().write_atomic(path, data)
        self._record("wrote", path)

    def create_exclusive(self, path: str, data: bytes) -> None:
        super().create_exclusive(path, data)
        self._record("wrote", path)

    def makedirs(self, path: str) -> None:
        super().makedirs(path)
        self._record("wrote", path)

    def rm(self, path: str, recursive: bool = False) -> None:
        self._record("delete", path)
        super().rm(path, recursive=recursive)


class OnThread:
    """A job run on a thread of its own, so the test can act while it runs."""

    def __init__(self, job: JobMaster):
        self.job, self.result, self.error = job, None, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.job.run()
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            self.error = e

    def join(self, timeout_s: float = 180):
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the job did not end"
        return self.result


def wait_until(condition, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
