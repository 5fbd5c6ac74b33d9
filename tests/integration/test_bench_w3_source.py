"""The W3 benchmark's source produces the workload W3 defines (bench/w3_source.py): a
load phase with every key exactly once, then change epochs of distinct keys. It builds
on GeneratorSource's internals, which once changed under it unnoticed (the benchmark
then measured hashed keys instead)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from sparkpoint.connectors.base import SourceContext

pytestmark = pytest.mark.spark

W3_SOURCE = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "w3_source.py")


def test_w3_load_covers_every_key_once_and_each_change_epoch_has_distinct_keys(spark):
    spec = importlib.util.spec_from_file_location("w3_source", W3_SOURCE)
    w3_source = importlib.util.module_from_spec(spec)  # not put in sys.modules: bench/ is not a package
    spec.loader.exec_module(w3_source)

    source = w3_source.W3Source(keys=1_000, changed=100, change_epochs=3, load_epoch_records=400)
    source.open(SourceContext(spark, "w3-check"))
    positions, epochs = source.initial_positions(), []
    while not source.is_exhausted(positions):
        plan = source.plan(positions)
        epochs.append([r.key for r in source.read(plan).collect()])
        positions = plan.end
    loads = source.load_epochs()
    assert sorted(k for keys in epochs[:loads] for k in keys) == list(range(1_000))
    assert len(epochs) == loads + 3
    for keys in epochs[loads:]:
        assert len(keys) == len(set(keys)) == 100
