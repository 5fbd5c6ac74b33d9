"""The Nexmark source's positions (event numbers), bounded and unbounded, and how the
example pipelines pick their input and output from the environment."""

from __future__ import annotations

import pytest

from sparkpoint.connectors.base import SlicePlan
from sparkpoint.connectors.files import FileSource
from sparkpoint.connectors.nexmark import NexmarkConfig
from sparkpoint.connectors.nexmark_io import nexmark_input, nexmark_output, side_input_path
from sparkpoint.connectors.nexmark_source import NexmarkSource
from sparkpoint.errors import ConfigError


def test_a_bounded_source_plans_epochs_of_event_numbers_up_to_its_end():
    source = NexmarkSource("bid", events=500, max_events_per_epoch=200)
    positions, plans = source.initial_positions(), []
    while not source.is_exhausted(positions):
        plan = source.plan(positions)
        plans.append((plan.start["events"], plan.end["events"]))
        assert source.lag(positions) == {"events": 500 - plan.start["events"]}
        positions = plan.end
    assert plans == [(0, 200), (200, 400), (400, 500)]
    assert source.lag(positions) == {"events": 0}
    assert source.plan(positions).empty


def test_an_unbounded_source_never_ends():
    source = NexmarkSource("person", max_events_per_epoch=1_000)
    far = {"events": 10**12}
    assert not source.is_exhausted(far) and source.lag(far) == {}
    assert source.plan(far) == SlicePlan(far, {"events": 10**12 + 1_000})


def test_the_seed_is_given_once():
    assert NexmarkSource("bid", seed=5).config == NexmarkConfig(seed=5)
    assert NexmarkSource("bid", config=NexmarkConfig(seed=5, rate=20)).config.rate == 20
    with pytest.raises(ConfigError, match="give the seed in config or as seed=, not both"):
        NexmarkSource("bid", seed=4, config=NexmarkConfig(seed=5))


def test_an_unknown_stream_is_refused_with_the_streams_there_are():
    with pytest.raises(ConfigError, match="unknown nexmark stream 'bids': use one of person, auction, bid"):
        NexmarkSource("bids")


def test_without_an_input_directory_the_examples_generate_their_events(monkeypatch):
    monkeypatch.delenv("NEXMARK_INPUT", raising=False)
    monkeypatch.setenv("NEXMARK_EVENTS", "20_000")
    monkeypatch.setenv("NEXMARK_SEED", "9")
    source = nexmark_input("auction")
    assert isinstance(source, NexmarkSource)
    assert (source.stream, source.events, source.config.seed) == ("auction", 20_000, 9)
    monkeypatch.setenv("NEXMARK_EVENTS", "many")
    with pytest.raises(ConfigError, match="NEXMARK_EVENTS='many' is not a whole number"):
        nexmark_input("auction")


def test_an_input_directory_is_read_as_bounded_parquet_per_stream(tmp_path, monkeypatch):
    (tmp_path / "person").mkdir()
    monkeypatch.setenv("NEXMARK_INPUT", str(tmp_path))
    source = nexmark_input("person")
    assert isinstance(source, FileSource)
    assert (source.path, source.format, source.bounded) == (str(tmp_path / "person"), "parquet", True)


def test_output_goes_to_nexmark_output_or_a_directory_per_query(tmp_path, monkeypatch):
    monkeypatch.setenv("NEXMARK_OUTPUT", str(tmp_path / "out"))
    assert nexmark_output("q1").path.endswith(str(tmp_path / "out"))
    monkeypatch.delenv("NEXMARK_OUTPUT")
    monkeypatch.chdir(tmp_path)
    assert nexmark_output("q7").path.endswith("nexmark-output/q7")


def test_the_side_input_is_written_on_first_use_beside_the_input(tmp_path, monkeypatch):
    monkeypatch.delenv("NEXMARK_SIDE_INPUT", raising=False)
    monkeypatch.setenv("NEXMARK_INPUT", str(tmp_path))
    path = side_input_path()
    assert path == str(tmp_path / "side_input.csv")
    lines = (tmp_path / "side_input.csv").read_text().splitlines()
    assert lines[:3] == ["0,0", "1,1", "2,2"] and lines[-1] == "9999,9999" and len(lines) == 10_000
