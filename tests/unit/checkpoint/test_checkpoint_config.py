from __future__ import annotations

import pytest

from sparkpoint.checkpoint import CheckpointCoordinatorConfig
from sparkpoint.errors import ConfigError


def test_defaults_tolerate_a_transient_outage():
    config = CheckpointCoordinatorConfig(interval_ms=60_000)
    assert config.tolerable_failed == 10
    assert (config.min_pause_ms, config.timeout_ms, config.max_concurrent, config.num_retained) == (0, 600_000, 1, 3)


@pytest.mark.parametrize("field, value, key", [
    ("interval_ms", 0, "execution.checkpointing.interval"),
    ("min_pause_ms", -1, "execution.checkpointing.min-pause"),
    ("timeout_ms", 0, "execution.checkpointing.timeout"),
    ("max_concurrent", 0, "execution.checkpointing.max-concurrent-checkpoints"),
    ("tolerable_failed", -1, "execution.checkpointing.tolerable-failed-checkpoints"),
    ("num_retained", 0, "execution.checkpointing.num-retained"),
    ("interval_ms", True, "execution.checkpointing.interval"),
    ("timeout_ms", 1.5, "execution.checkpointing.timeout"),
])
def test_invalid_values_name_the_flink_key_and_the_bad_value(field, value, key):
    kwargs = {"interval_ms": 1000, field: value}
    with pytest.raises(ConfigError) as error:
        CheckpointCoordinatorConfig(**kwargs)
    assert key in str(error.value)
    assert repr(value) in str(error.value)


def test_config_is_frozen():
    config = CheckpointCoordinatorConfig(interval_ms=1000)
    with pytest.raises(AttributeError):
        config.interval_ms = 5  # type: ignore[misc]
