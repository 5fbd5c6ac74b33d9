"""The per-event latency of the Real-time Mode benchmark (bench/latency_spark_rtm.py):
for each event, the first output record of its key (in arrival order) whose max(send_ms)
reaches the event's send_ms answers it. Checked against a plain per-event search, on
random data and on the cases a vectorised search gets wrong: a replayed (older) record
arriving after a newer one, an event no record answers, and keys next to each other."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


def _latencies():
    name = "bench_latency_spark_rtm"
    if name not in sys.modules:
        sys.path.insert(0, os.path.abspath(BENCH))  # the script imports its sibling process_tree
        spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, "latency_spark_rtm.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].latencies


def _reference(send_ms, keys, out):
    lat = np.full(len(send_ms), np.nan)
    order = np.argsort(out["arrival"], kind="stable")
    for i, (s, k) in enumerate(zip(send_ms, keys)):
        for j in order:
            if out["key"][j] == k and out["max_ms"][j] >= s:
                lat[i] = out["arrival"][j] - s
                break
    return lat


def _out(arrival, key, max_ms):
    return {"arrival": np.array(arrival, dtype=np.float64), "key": np.array(key, dtype=np.int64),
            "max_ms": np.array(max_ms, dtype=np.int64)}


def test_latency_is_the_first_arrival_covering_the_event_on_random_data():
    rng = np.random.default_rng(3)
    n, keys = 2_000, 17
    send_ms = 1_800_000_000_000 + np.sort(rng.integers(0, 5_000, n))
    key = rng.integers(0, keys, n)
    # Outputs: per event, sometimes one record carrying that key's max so far, late by 0–800 ms.
    arrival, o_key, o_max, seen = [], [], [], {}
    for s, k in zip(send_ms, key):
        seen[k] = max(seen.get(k, 0), s)
        if rng.random() < 0.3:
            arrival.append(s + rng.integers(0, 800))
            o_key.append(k)
            o_max.append(seen[k])
    out = _out(arrival, o_key, o_max)
    got, want = _latencies()(send_ms, key, out), _reference(send_ms, key, out)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.allclose(got[~np.isnan(want)], want[~np.isnan(want)])
    assert (~np.isnan(want)).sum() > n // 2  # most events answered: the case is not vacuous


def test_a_replayed_older_record_does_not_answer_a_newer_event():
    t = 1_800_000_000_000
    send_ms, key = np.array([t, t + 100, t + 200]), np.array([5, 5, 5])
    # The record covering t+200 arrives first; a replay of an older state (max t) after it.
    out = _out(arrival=[t + 250, t + 900], key=[5, 5], max_ms=[t + 200, t])
    got = _latencies()(send_ms, key, out)
    assert got.tolist() == [250.0, 150.0, 50.0]
    assert np.array_equal(got, _reference(send_ms, key, out))


def test_an_event_no_record_covers_has_no_latency_and_keys_do_not_answer_each_other():
    t = 1_800_000_000_000
    send_ms, key = np.array([t, t + 10, t + 20]), np.array([2, 1, 1])
    # Key 2's record reaches far past key 1's events; key 1's only record is older than
    # its second event, which no record of its own covers.
    out = _out(arrival=[t + 40, t + 50], key=[1, 2], max_ms=[t + 10, t + 10_000])
    got = _latencies()(send_ms, key, out)
    assert got[0] == 50.0 and got[1] == 30.0 and np.isnan(got[2])
    assert np.array_equal(np.isnan(got), np.isnan(_reference(send_ms, key, out)))
