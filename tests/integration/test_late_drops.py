"""Rows a window drops as too late are counted, not lost silently: every event is
either in a window's count or in the late-drop counter."""

from __future__ import annotations

import pytest

from failure_support import settings
from sparkpoint import GeneratorSource, ParquetSink, Pipeline, TumblingWindow
from sparkpoint.runtime.jobmaster import JobMaster
from tests.e2e.harness import read_output

pytestmark = pytest.mark.spark

TOTAL = 10_000


def test_every_event_is_in_a_window_or_counted_as_dropped_late(spark, tmp_path):
    # Events arrive up to 3 s out of order, the watermark waits 0.5 s: some are late.
    pipeline = (Pipeline("late").source(GeneratorSource("events", keys=50, total_events=TOTAL,
                                                        max_records_per_epoch=2_000, disorder_ms=3_000))
                .watermark("ts", delay="500 ms")
                .stateful(TumblingWindow("windows", ["key"], "ts", size="1 s", aggs=("count",)))
                .sink(ParquetSink(str(tmp_path / "out"))))
    job = JobMaster(pipeline, settings(tmp_path, "late", []), spark=spark)
    job.run()
    counted = sum(read_output(tmp_path / "out").column("count").to_pylist())
    assert job.late_dropped > 0
    assert counted + job.late_dropped == TOTAL
