"""A keyed aggregate's update-mode output is exactly once across a crash, epoch by epoch.

Update-mode rows (each key an epoch touched, with its running totals) depend on where
epochs begin; those are a pure function of the restored source positions, so even the
per-epoch updates of a crashed and restored job, epoch numbers included, must be the
ones the input alone gives (tests/e2e/chaos_oracles.py, computed without Spark or
sparkpoint). The job crashes in-process (tests/inprocess.py) right after its first
checkpoint's `_metadata` is durable and before that checkpoint's output is committed (the
restore must re-run that commit and then the epochs after it). A real SIGKILL of a
Parquet job is tests/e2e/test_chaos.py."""

from __future__ import annotations

import re

import pytest

from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline
from sparkpoint.runtime.status import JobStatus
from tests.e2e.chaos_oracles import aggregate_updates, as_canonical
from tests.e2e.harness import canonical, read_output
from tests.inprocess import CrashPoint, job_settings, restart, start

pytestmark = pytest.mark.spark

NAME = "updates"
# 10 epochs: the first checkpoint (after 1 s) completes before the input ends.
KEYS, TOTAL, PER_EPOCH = 500, 20_000, 2_000


def _pipeline(out) -> Pipeline:
    return (Pipeline(NAME)
            .source(GeneratorSource("events", keys=KEYS, total_events=TOTAL, max_records_per_epoch=PER_EPOCH))
            .stateful(KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
            .sink(ParquetSink(str(out))))


def test_keyed_aggregate_updates_are_exactly_once_after_a_crash_before_the_commit(spark, tmp_path):
    out = tmp_path / "out"
    first = start(_pipeline(out), job_settings(tmp_path, NAME), spark,
                  crash_at=CrashPoint.after_metadata(1)).wait_crashed()
    assert first.switch.completed == 1 and not first.job.final_done, first.tail()
    assert not read_output(out).num_rows, "the crash came before the checkpoint's output was committed"

    second = restart(first, _pipeline(out), spark)
    assert second.wait().status is JobStatus.FINISHED, second.tail()
    assert second.job.restored_from is not None, second.tail()
    resumed = re.search(r"resuming from checkpoint \d+ \(epoch (\d+), taken ", second.text)
    assert resumed and int(resumed.group(1)) < TOTAL // PER_EPOCH - 1, "the restored run had epochs left to run"

    output = read_output(out)
    expected = as_canonical(aggregate_updates(TOTAL, keys=KEYS, per_epoch=PER_EPOCH), output.column_names)
    assert output.column_names == ["key", "count", "sum", "min", "max", "epoch"]
    assert len(expected) > KEYS
    got = canonical(output, drop=())
    assert len(got) == len(expected), "update rows lost or duplicated"
    assert got == expected
