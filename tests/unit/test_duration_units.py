"""Units that surprise: a bare number for a duration is milliseconds (Flink's rule), so
`execution.checkpointing.timeout=30` is 30 ms. Start-up warns about such values, and
every EXPIRED message says what the timeout was."""

from __future__ import annotations

import logging
import random

import pytest

from sparkpoint.checkpoint import (
    CheckpointCoordinator,
    CheckpointCoordinatorConfig,
    CheckpointFailedError,
    CheckpointFailureReason,
    ManualScheduler,
)
from sparkpoint.config import Settings
from tests.memory import InMemoryCheckpointStorage, InMemoryIdCounter, RecordingGateway


@pytest.mark.parametrize("source", ["override", "set", "yaml"])
def test_a_bare_small_number_for_a_timeout_is_warned_about_naming_key_value_and_fix(tmp_path, source):
    if source == "override":
        settings = Settings.load(overrides={"execution.checkpointing.timeout": 30})
    elif source == "set":
        settings = Settings.load(sets=["execution.checkpointing.timeout=30"])
    else:
        (tmp_path / "job.yaml").write_text("execution:\n  checkpointing:\n    timeout: 30\n")
        settings = Settings.load(tmp_path / "job.yaml")
    assert settings.checkpoint_timeout_ms == 30  # Flink's rule stays: the value is not reinterpreted
    [warning] = settings.unit_warnings
    assert "execution.checkpointing.timeout=30" in warning
    assert "30 ms" in warning and "'30 s'" in warning


@pytest.mark.parametrize("overrides", [
    {"execution.checkpointing.timeout": "30 s"},          # a unit: meant as written
    {"execution.checkpointing.timeout": 30_000},          # a bare number that is plausible in ms
    {"execution.checkpointing.interval": "50 ms"},        # a small value with a unit is deliberate
    {"restart-strategy.fixed-delay.delay": 10},           # short restart delays are plausible
    {"execution.checkpointing.min-pause": 0},
    {},
])
def test_no_warning_for_units_or_plausible_values(overrides):
    assert Settings.load(overrides=overrides).unit_warnings == []


def test_every_interval_and_timeout_key_is_checked():
    settings = Settings.load(overrides={"execution.checkpointing.interval": 5, "sparkpoint.lease.ttl": 15,
                                        "state.changelog.periodic-materialize.interval": 10})
    keys = sorted(w.split("=")[0] for w in settings.unit_warnings)
    assert keys == ["execution.checkpointing.interval", "sparkpoint.lease.ttl",
                    "state.changelog.periodic-materialize.interval"]


def test_the_warning_is_printed_when_a_job_starts(tmp_path, caplog):
    from sparkpoint import GeneratorSource, ParquetSink, Pipeline
    from sparkpoint.runtime.jobmaster import JobMaster

    settings = Settings.load(overrides={"execution.checkpointing.timeout": 30,
                                        "execution.checkpointing.dir": str(tmp_path / "chk")})
    pipeline = Pipeline("units").source(GeneratorSource("g", keys=2)).sink(ParquetSink(str(tmp_path / "out")))
    with caplog.at_level(logging.WARNING):
        JobMaster(pipeline, settings)  # start-up, before Spark is touched
    shown = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("execution.checkpointing.timeout=30" in m and "'30 s'" in m for m in shown), shown


def _coordinator(timeout_ms: int):
    config = CheckpointCoordinatorConfig(interval_ms=1000, min_pause_ms=0, timeout_ms=timeout_ms,
                                         max_concurrent=1, tolerable_failed=5, num_retained=2)
    scheduler = ManualScheduler()
    gateway = RecordingGateway(participant_ids=["job", "source:s", "state:op/0"])
    coordinator = CheckpointCoordinator("units", config, scheduler, InMemoryIdCounter(),
                                        InMemoryCheckpointStorage(), gateway, rng=random.Random(1),
                                        fail_job=lambda *_: None)
    return coordinator, scheduler


def test_an_expired_checkpoint_says_what_the_timeout_was_in_the_log_and_the_error(caplog):
    coordinator, scheduler = _coordinator(timeout_ms=30)
    with caplog.at_level(logging.WARNING, logger="sparkpoint"):
        future = coordinator.trigger_checkpoint(forced=True)
        scheduler.advance(30)
    with pytest.raises(CheckpointFailedError) as err:
        future.result(timeout=0)
    assert err.value.reason is CheckpointFailureReason.EXPIRED
    for text in (str(err.value), *[r.getMessage() for r in caplog.records if "EXPIRED" in r.getMessage()]):
        assert "execution.checkpointing.timeout=30 ms" in text, text
    assert any("EXPIRED" in r.getMessage() for r in caplog.records)
    coordinator.shutdown()
