"""Epochs sized by time: the sizer against a modelled epoch cost (fixed part + part per
record), and the sources' cuts of a slice."""

from __future__ import annotations

import logging

import pytest

from sparkpoint.connectors.base import SlicePlan
from sparkpoint.connectors.files import FileSource
from sparkpoint.connectors.generator import GeneratorSource
from sparkpoint.runtime.epoch_sizer import FLOOR_DIVISOR, EpochSizer


def run(sizer: EpochSizer, epochs: int, cost, planned: int = 500_000) -> list[tuple[int, float]]:
    """`epochs` epochs of a backlogged source that plans `planned` records each time."""
    out = []
    for _ in range(epochs):
        size = sizer.limit(planned)
        took = cost(size)
        sizer.observe(size, planned, took)
        out.append((size, took))
    return out


def test_epochs_converge_on_the_target_duration():
    sizer = EpochSizer(500)
    # 0.15 s fixed + 2 µs per record: 500k-record epochs take 1.15 s.
    epochs = run(sizer, 15, lambda n: 0.15 + 2e-6 * n)
    assert epochs[0] == (500_000, pytest.approx(1.15))
    for size, took in epochs[-5:]:
        assert took == pytest.approx(0.5, rel=0.05)
        assert size == pytest.approx(175_000, rel=0.05)


def test_a_slow_first_epoch_does_not_shrink_the_next_below_a_quarter():
    sizer = EpochSizer(500)
    size = sizer.limit(400_000)
    sizer.observe(size, 400_000, 20.0)  # JVM warm-up: the first epoch takes 20 s
    assert sizer.limit(400_000) == 100_000


def test_a_short_epoch_of_a_source_with_no_more_input_does_not_grow_the_budget():
    sizer = EpochSizer(500)
    sizer.observe(400_000, 400_000, 1.0)  # too long: cut to half
    assert sizer.limit(400_000) == 200_000
    sizer.observe(1_000, 1_000, 0.05)  # little input, short epoch: says nothing about the budget
    assert sizer.limit(400_000) == 200_000
    sizer.observe(200_000, 400_000, 0.25)  # cut and short: grows, at most doubling
    assert sizer.limit(400_000) == 400_000


def test_the_budget_is_dropped_once_the_sources_own_limit_fits_the_target():
    sizer = EpochSizer(500)
    run(sizer, 3, lambda n: 0.1 + 4e-6 * n, planned=200_000)  # 200k take 0.9 s: cut
    assert sizer.budget is not None
    run(sizer, 10, lambda n: 0.1 + 1e-6 * n, planned=200_000)  # the job got faster
    assert sizer.budget is None
    assert sizer.limit(200_000) == 200_000


def test_a_fixed_cost_above_the_target_stops_at_the_floor_and_says_so(caplog):
    sizer = EpochSizer(100)
    with caplog.at_level(logging.WARNING):
        epochs = run(sizer, 20, lambda n: 0.3 + 1e-6 * n, planned=640_000)
    assert epochs[-1][0] == 640_000 // FLOOR_DIVISOR
    assert sum("Raise the target" in r.message for r in caplog.records) == 1


def test_generator_slices_are_cut_in_proportion_and_keep_every_split_moving():
    source = GeneratorSource(splits=3, max_records_per_epoch=300_000)
    plan = source.plan({"0": 0, "1": 50, "2": 7})
    assert source.plan_size(plan) == 300_000
    cut = source.shrink(plan, 30_000)
    assert cut.start == plan.start
    assert cut.end == {"0": 10_000, "1": 10_050, "2": 10_007}
    assert source.plan_size(cut) == 30_000
    tiny = source.shrink(plan, 2)  # fewer units than splits: one record each, none left behind
    assert tiny.end == {"0": 1, "1": 51, "2": 8}
    assert source.shrink(plan, 10**9) is plan


def test_a_split_with_nothing_to_read_is_not_given_records_it_does_not_have():
    source = GeneratorSource(splits=2)
    plan = SlicePlan({"0": 100, "1": 5}, {"0": 100, "1": 1_005})
    assert source.shrink(plan, 10).end == {"0": 100, "1": 15}


def test_file_slices_are_cut_to_the_first_new_files_in_name_order(tmp_path):
    source = FileSource(str(tmp_path), schema="v BIGINT", max_files_per_epoch=10)
    for name in ["c.json", "a.json", "d.json", "b.json"]:
        (tmp_path / name).write_text('{"v": 1}\n')
    plan = source.plan({"dir": ["a.json"]})
    assert source.plan_size(plan) == 3
    cut = source.shrink(plan, 2)
    assert cut.end == {"dir": ["a.json", "b.json", "c.json"]}
    assert source.plan_size(cut) == 2
    assert source.shrink(plan, 0).end == {"dir": ["a.json", "b.json"]}  # an epoch reads at least one file


def test_positions_that_are_not_offsets_are_never_cut():
    source = GeneratorSource()
    assert source.plan_size(SlicePlan({"x": "abc"}, {"x": "abd"})) is None


def test_a_bad_target_is_one_config_error_naming_the_key():
    from sparkpoint.config import Settings
    from sparkpoint.errors import ConfigError

    assert Settings.load(overrides={"sparkpoint.epoch.target-duration": "500 ms"}).epoch_target_ms == 500
    assert Settings.load().epoch_target_ms == 0  # off by default
    with pytest.raises(ConfigError, match="sparkpoint.epoch.target-duration.*soon"):
        Settings.load(overrides={"sparkpoint.epoch.target-duration": "soon"})
