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


# -- the ceiling (no target set): a slow step must not make checkpoints expire ------------

def test_under_the_ceiling_epochs_keep_the_sources_own_limits():
    sizer = EpochSizer.ceiling(15_000)
    epochs = run(sizer, 10, lambda n: 0.4 + 2e-6 * n)  # 1.4 s epochs: well under 15 s
    assert {size for size, _ in epochs} == {500_000}
    assert sizer.budget is None


def test_an_epoch_past_the_ceiling_cuts_the_next_to_half_of_it_at_once(caplog):
    sizer = EpochSizer.ceiling(15_000)
    with caplog.at_level(logging.WARNING, logger="sparkpoint.runtime.epoch_sizer"):
        # A Python processor at ~8k records/s: a 500k-record epoch takes a minute.
        epochs = run(sizer, 6, lambda n: 0.5 + n / 8_000)
    assert epochs[0][1] > 60
    # Not a quarter per epoch as for a target: the first cut epoch is already under the ceiling.
    assert all(took <= 15 for _, took in epochs[1:]), epochs
    assert epochs[-1][1] == pytest.approx(7.5, rel=0.05)
    lines = [r.getMessage() for r in caplog.records if "max-duration" in r.getMessage()]
    assert len(lines) == 1
    assert "execution.checkpointing.timeout" in lines[0] and "runs slower rather than failing" in lines[0]


def test_a_cut_job_that_speeds_up_goes_back_to_the_sources_own_limits():
    sizer = EpochSizer.ceiling(15_000)
    run(sizer, 3, lambda n: 0.5 + n / 8_000)
    assert sizer.budget is not None
    run(sizer, 12, lambda n: 0.5 + 2e-6 * n)  # the slow step got fast again
    assert sizer.budget is None and sizer.limit(500_000) == 500_000


def test_the_ceiling_defaults_to_a_quarter_of_the_checkpoint_timeout_and_0_turns_it_off():
    from sparkpoint import Settings

    assert Settings.load().epoch_ceiling_ms == 15_000
    assert Settings.load(overrides={"execution.checkpointing.timeout": "10 min"}).epoch_ceiling_ms == 150_000
    assert Settings.load(overrides={"sparkpoint.epoch.max-duration": "20 s"}).epoch_ceiling_ms == 20_000
    assert Settings.load(overrides={"sparkpoint.epoch.max-duration": 0}).epoch_ceiling_ms == 0


def test_a_job_with_several_sources_has_each_slice_cut_by_the_same_fraction():
    from types import SimpleNamespace

    from sparkpoint.runtime.jobmaster import JobMaster

    sources = {"bids": GeneratorSource("bids", keys=10, total_events=10**6),
               "auctions": GeneratorSource("auctions", keys=10, total_events=10**6)}
    plans = {"bids": SlicePlan({"0": 0, "1": 0}, {"0": 10_000, "1": 10_000}),
             "auctions": SlicePlan({"0": 500}, {"0": 10_500})}
    sizer = EpochSizer.ceiling(1_000)
    job = SimpleNamespace(sources=sources, epoch_sizer=sizer)
    assert JobMaster._sized(job, plans) == (plans, 30_000, 30_000)  # not cut yet

    sizer.observe(30_000, 30_000, 3.0)  # 3 s against a 1 s ceiling: aim at 0.5 s
    cut, planned, taken = JobMaster._sized(job, plans)
    assert (planned, taken) == (30_000, 4_998)  # 3,333 bids over two splits, 1,666 auctions
    assert cut["bids"].end == {"0": 1_666, "1": 1_666} and cut["auctions"].end == {"0": 500 + 1_666}
    assert cut["bids"].start == plans["bids"].start and cut["auctions"].start == plans["auctions"].start
