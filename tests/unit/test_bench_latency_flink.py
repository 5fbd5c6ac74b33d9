"""The PyFlink latency runner's bookkeeping (bench/pyflink/latency_flink.py): which committed file
makes an event visible, and what counts as committed output. Pure Python: the Flink job itself
needs the PyFlink virtualenv, which CI does not have."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


@pytest.fixture(scope="module")
def latency_flink():
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location("latency_flink",
                                                      os.path.join(BENCH, "pyflink", "latency_flink.py"))
        module = importlib.util.module_from_spec(spec)  # not in sys.modules: bench/ is not a package
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved  # the module puts bench/ first on the path for its own imports
    return module


def test_an_event_overtaken_by_a_later_event_of_its_key_is_visible_with_the_earlier_file(latency_flink):
    # Key 1: the event arriving at 1100 (from the other source subtask) reached the aggregate after
    # the one arriving at 1200, whose row (MAX 1200) was committed at 2000: the 1100 event's effect
    # was visible from then, not from its own row's file at 3000. Key 2 has a later MAX in an
    # earlier file of key 1: it must not count for key 2.
    keys = np.array([1, 1, 1, 2])
    max_arrival = np.array([1000, 1200, 1200, 900])
    arrival = np.array([1000, 1200, 1100, 900])
    visible = np.array([2000.0, 2000.0, 3000.0, 5000.0])

    lat = latency_flink.event_latencies(keys, max_arrival, arrival, visible)

    assert lat.tolist() == [1000.0, 800.0, 900.0, 4100.0]


def test_committed_rows_are_the_insert_and_update_after_rows_of_finished_files(latency_flink, tmp_path):
    (tmp_path / "part-a-0-0").write_text("+I[7, 1, 5, 1000, 1000, 1001]\n-U[7, 1, 5, 1000, 1000, 1001]\n"
                                         "+U[7, 2, 9, 1010, 1010, 1012]\n")
    (tmp_path / "part-a-1-0").write_text("+I[8, 1, 3, 1005, 1005, 1005]\n")

    columns = latency_flink.read_updates(str(tmp_path), {"part-a-0-0": 2.0, "part-a-1-0": 2.5})

    rows = sorted(zip(*(c.tolist() for c in columns)))  # key, MAX(arrival), arrival, generated, visible ms
    assert rows == [(7, 1000, 1000, 1001, 2000.0), (7, 1010, 1010, 1012, 2000.0), (8, 1005, 1005, 1005, 2500.0)]


def test_the_watcher_sees_a_part_file_once_it_is_finished_and_keeps_its_first_sighting(latency_flink, tmp_path):
    watcher = latency_flink.Watcher(str(tmp_path))
    (tmp_path / ".part-a-0-0.inprogress.1234").write_text("+I[7, 1, 5, 1000, 1000]\n")
    watcher.scan()
    assert watcher.first_seen == {} and watcher.commits == 0

    os.rename(tmp_path / ".part-a-0-0.inprogress.1234", tmp_path / "part-a-0-0")
    watcher.scan()
    first = dict(watcher.first_seen)
    watcher.scan()

    assert list(first) == ["part-a-0-0"]
    assert watcher.first_seen == first and watcher.commits == 1
