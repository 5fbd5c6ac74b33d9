"""The latency benchmark's sparkpoint runner (bench/latency.py) runs a real job on the
shared session and measures every event it was given: a runner that no longer fits the
runtime (its job master hooks the epoch loop) must fail here, not at the next sitting."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import pytest

pytestmark = pytest.mark.spark

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


def _latency_module():
    name = "bench_latency"  # bench/ is not a package: its modules import each other by name
    if name not in sys.modules:
        sys.path.insert(0, os.path.abspath(BENCH))
        spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, "latency.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_the_sparkpoint_latency_runner_measures_every_event_it_was_given(spark, tmp_path):
    latency = _latency_module()
    args = argparse.Namespace(rate=4_000, keys=500, work=str(tmp_path), skip_s=0.5, checkpoint_interval="500 ms")
    rss = latency.PeakRss()
    try:
        result = latency.run_sparkpoint(spark, args, 3, "test", rss)
    finally:
        rss.stop()
    assert result["status"] == "FINISHED"
    assert result["config"] == "ckpt-500ms"
    assert result["events"] == 12_000  # rate × duration, all read
    # Every event that arrived after the skipped first half second has a latency: one per event.
    assert 0 < result["events_measured"] <= result["events"]
    assert result["events_measured"] >= result["events"] * 2 // 3
    assert result["commits"] >= 1 and result["epochs"] >= 1
    # Visible after it arrived, and no later than the run's end plus its final checkpoint.
    assert 0 < result["latency_p50_ms"] <= result["latency_max_ms"] < 60_000
