"""A keyed aggregate's update-mode output is exactly once across a crash, epoch by epoch.

Update-mode rows (each key an epoch touched, with its running totals) depend on where
epochs begin; those are a pure function of the restored source positions, so even the
per-epoch updates of a crashed and restored job, epoch numbers included, must be the
ones the input alone gives (tests/e2e/chaos_oracles.py, computed without Spark or
sparkpoint). The job crashes in-process (tests/inprocess.py) right after a checkpoint's
`_metadata` is durable and before its output is committed, and once more at the end of an
epoch no checkpoint carries yet. A real SIGKILL of a Parquet job is
tests/e2e/test_exactly_once_kill.py."""

from __future__ import annotations

import pytest

from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline
from sparkpoint.runtime.status import JobStatus
from tests.e2e.chaos_oracles import aggregate_updates, as_canonical
from tests.e2e.harness import canonical, read_output
from tests.inprocess import CrashPoint, job_settings, restart, start

pytestmark = pytest.mark.spark

NAME = "updates"
# 20 epochs: the first checkpoint (after 1 s) completes long before the input ends.
KEYS, TOTAL, PER_EPOCH = 500, 60_000, 3_000


def _pipeline(out) -> Pipeline:
    return (Pipeline(NAME)
            .source(GeneratorSource("events", keys=KEYS, total_events=TOTAL, max_records_per_epoch=PER_EPOCH))
            .stateful(KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
            .sink(ParquetSink(str(out))))


def _after_staging(n: int) -> CrashPoint:
    """Once this run staged its `n`th epoch (after a restore: wherever that is)."""
    staged = []

    def matches(event, _completed) -> bool:
        if event.seam == "sink" and event.after and event.what in ("stage_epoch", "write_epoch"):
            staged.append(event.epoch)
        return len(staged) >= n

    return CrashPoint(f"after this run staged {n} epochs", matches)


def test_keyed_aggregate_updates_are_exactly_once_after_two_crashes(spark, tmp_path):
    out = tmp_path / "out"
    settings = job_settings(tmp_path, NAME)
    first = start(_pipeline(out), settings, spark, crash_at=CrashPoint.after_metadata(1)).wait_crashed()
    assert first.switch.completed >= 1 and not first.job.final_done, first.tail()

    second = restart(first, _pipeline(out), spark, crash_at=_after_staging(3))
    second.wait_crashed()
    assert second.job.restored_from is not None, second.tail()

    third = restart(second, _pipeline(out), spark)
    assert third.wait().status is JobStatus.FINISHED, third.tail()
    assert third.job.restored_from is not None, third.tail()

    output = read_output(out)
    expected = as_canonical(aggregate_updates(TOTAL, keys=KEYS, per_epoch=PER_EPOCH), output.column_names)
    assert output.column_names == ["key", "count", "sum", "min", "max", "epoch"]
    assert len(expected) > KEYS
    got = canonical(output, drop=())
    assert len(got) == len(expected), "update rows lost or duplicated"
    assert got == expected
