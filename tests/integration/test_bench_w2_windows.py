"""The row counts the W2 benchmarks assert their output against (bench/w2_windows.py,
numpy over the generator's events) equal Spark's batch `window` / `session_window`
groupBy on the same events: a wrong reference would fail a correct run, or pass a
wrong one, at every sitting."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

from sparkpoint.connectors.base import SlicePlan, SourceContext
from sparkpoint.connectors.generator import GeneratorSource

pytestmark = pytest.mark.spark

W2_WINDOWS = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "w2_windows.py")


def _module():
    name = "bench_w2_windows"  # bench/ is not a package; a dataclass needs its module in sys.modules
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, W2_WINDOWS)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _events(spark):
    """Generator events at W2's density per key (one event per key every 20 s of event
    time on average), and a key whose events are exactly one gap apart (spans that touch
    are one session) or a gap and 1 ms apart (two sessions)."""
    src = GeneratorSource("events", keys=200, total_events=30_000, event_time_per_s=10)
    src.open(SourceContext(spark, "w2-windows-check"))
    generated = src.read(SlicePlan(src.initial_positions(), {"0": 15_000, "1": 15_000})).select("key", "ts")
    start = 1_700_000_000_000
    touching = [start, start + 30_000, start + 60_000, start + 90_001, start + 120_001, start + 125_000]
    crafted = spark.createDataFrame([(-5, t) for t in touching], "key BIGINT, ts BIGINT")
    return generated.unionByName(crafted)


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
def test_expected_rows_equal_spark_batch_windows(spark, kind):
    from pyspark.sql import functions as F

    w2_windows = _module()
    windowing = w2_windows.Windowing(kind)
    events = _events(spark).cache()
    table = events.toArrow()
    got = windowing.count_rows(table.column("key").to_numpy(), table.column("ts").to_numpy())

    grouped = events.groupBy(windowing.spark_column(F.timestamp_millis("ts")).alias("w"), "key").count()
    assert got["output_rows"] == grouped.count()
    if kind == "session":
        assert got["windows"] is None
        assert grouped.where("key = -5").count() == 2
        assert got["events_per_session"] == pytest.approx(events.count() / grouped.count())
    else:
        assert got["windows"] == grouped.select("w.start").distinct().count()
    events.unpersist()


def test_sliding_with_the_slide_equal_to_the_size_counts_as_tumbling():
    w2_windows = _module()
    rng = np.random.default_rng(3)
    key, ts = rng.integers(0, 50, 5_000), rng.integers(0, 3_600_000, 5_000)
    tumbling = w2_windows.Windowing("tumbling").count_rows(key, ts)
    sliding = w2_windows.Windowing("sliding", slide_ms=60_000).count_rows(key, ts)
    assert tumbling == sliding
    assert tumbling["output_rows"] == len(set(zip(key.tolist(), (ts // 60_000).tolist())))
