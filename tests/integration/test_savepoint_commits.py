"""What an intermediate savepoint commits, on a real job (in process, one local Spark
session): nothing. The job takes a checkpoint, then a savepoint while it keeps running,
then an epoch fails before the next checkpoint. The failover restores the checkpoint
(a savepoint is not a restore point) and replays the epochs after it; their output must
then be published once, by a later checkpoint, and nothing a reader saw may be
withdrawn."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from failure_support import WINDOW_MS, Events, expected_windows, settings
from sparkpoint import GeneratorSource, Pipeline, TumblingWindow
from sparkpoint.connectors.parquet_sink import ParquetSink
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus
from sparkpoint.storage.metadata import decode
from tests.e2e.harness import canonical, read_output

pytestmark = pytest.mark.spark

@dataclass(frozen=True)
class QuickWindows(Events):
    """Events whose event time runs fast enough that every epoch closes a window, so
    every epoch stages output."""

    event_time_per_s: int = 1_000

    def source(self) -> GeneratorSource:
        return GeneratorSource("events", keys=self.keys, total_events=self.total,
                               max_records_per_epoch=self.per_epoch, splits=self.splits,
                               disorder_ms=self.disorder_ms, rate_per_s=self.rate_per_s,
                               event_time_per_s=self.event_time_per_s)


# Paced, so the test's steps (a checkpoint, a savepoint, a failure) land mid-run.
EVENTS = QuickWindows(keys=120, total=40_000, per_epoch=2_000, rate_per_s=6_000)


class FailWhenArmed:
    """A stateless step that fails the first epoch after the test arms it (user code
    raising on the driver: the job fails over)."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.fired = threading.Event()

    def __call__(self, df):
        if self.armed.is_set():
            self.armed.clear()
            self.fired.set()
            raise RuntimeError("injected: the epoch after the savepoint fails")
        return df


def _pipeline(out, step: FailWhenArmed) -> Pipeline:
    return (Pipeline("sp-commits").source(EVENTS.source())
            .transform(step)
            .watermark("ts", delay="2 s")
            .stateful(TumblingWindow("windows", ["key"], "ts", size_ms=WINDOW_MS, aggs=("count", "sum"),
                                     value_column="value", value_type="bigint"))
            .sink(ParquetSink(str(out))))


def _wait(condition, thread: threading.Thread, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert thread.is_alive(), f"the job ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_failover_after_an_intermediate_savepoint_publishes_each_row_once_and_withdraws_nothing(spark, tmp_path):
    expected = expected_windows(spark, EVENTS)
    out = tmp_path / "out"
    step = FailWhenArmed()
    # No periodic checkpoints: the test decides where the checkpoint and the savepoint are.
    job = JobMaster(_pipeline(out, step), settings(tmp_path, "sp-commits", [],
                                                   **{"execution.checkpointing.interval": "1 h"}), spark=spark)
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = job.run()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    _wait(lambda: job.epoch >= 2, thread, "epoch 2")
    checkpoint = job.trigger_checkpoint().result(120)
    at_checkpoint = job.epoch
    _wait(lambda: job.epoch >= at_checkpoint + 2, thread, "two epochs after the checkpoint")
    job.trigger_savepoint(str(tmp_path / "savepoint")).result(120)
    savepoint = decode((tmp_path / "savepoint" / "_metadata").read_bytes())
    assert savepoint.handles[job.sink_participant]["staged"], "no output was staged before the savepoint"
    job.gateway.drain_commits()  # whatever the savepoint's completion set off has run
    seen_after_savepoint = set(ParquetSink(str(out)).committed_files())
    step.armed.set()  # before the next checkpoint: there is none until the input ends

    thread.join(300)
    assert not thread.is_alive(), "the job did not end"
    if "error" in outcome:
        raise outcome["error"]
    assert outcome["result"].status is JobStatus.FINISHED
    assert step.fired.is_set() and job.restarts == 1
    assert job.restored_from == checkpoint.checkpoint_id, "the failover restores the checkpoint, not the savepoint"

    assert canonical(read_output(out)) == expected
    withdrawn = seen_after_savepoint - set(ParquetSink(str(out)).committed_files())
    assert not withdrawn, f"output committed at the savepoint was withdrawn by the failover: {sorted(withdrawn)}"
