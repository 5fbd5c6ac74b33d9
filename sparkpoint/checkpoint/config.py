"""How often and how patiently the coordinator checkpoints (Flink's checkpointing keys)."""

from __future__ import annotations

from dataclasses import dataclass

from sparkpoint.errors import ConfigError

# Ten consecutive counted failures: at a one-minute interval a job rides out a
# storage outage of about ten minutes without restarting. A restart would not help
# during such an outage anyway (restoring needs the same storage), and Flink's
# default of 0 turns every transient blip into a full failover (seeds 001, 003).
# It stays finite so that storage that is broken for good still surfaces as a
# job failure instead of a job that silently never checkpoints.
DEFAULT_TOLERABLE_FAILED_CHECKPOINTS = 10


@dataclass(frozen=True)
class CheckpointCoordinatorConfig:
    """Times are in milliseconds.

    - ``interval_ms``: time between periodic triggers (execution.checkpointing.interval)
    - ``min_pause_ms``: at least this long after a completion before the next trigger
    - ``timeout_ms``: a checkpoint not complete after this long expires
    - ``max_concurrent``: checkpoints in flight at once
    - ``tolerable_failed``: consecutive counted failures tolerated; one more fails the job
    - ``num_retained``: completed checkpoints kept; older ones are discarded
    """

    interval_ms: int
    min_pause_ms: int = 0
    timeout_ms: int = 600_000
    max_concurrent: int = 1
    tolerable_failed: int = DEFAULT_TOLERABLE_FAILED_CHECKPOINTS
    num_retained: int = 3

    def __post_init__(self) -> None:
        _require(self.interval_ms, 1, "execution.checkpointing.interval", "a number of ms >= 1")
        _require(self.min_pause_ms, 0, "execution.checkpointing.min-pause", "a number of ms >= 0")
        _require(self.timeout_ms, 1, "execution.checkpointing.timeout", "a number of ms >= 1")
        _require(self.max_concurrent, 1, "execution.checkpointing.max-concurrent-checkpoints",
                 "an integer >= 1")
        _require(self.tolerable_failed, 0, "execution.checkpointing.tolerable-failed-checkpoints",
                 "an integer >= 0")
        _require(self.num_retained, 1, "execution.checkpointing.num-retained", "an integer >= 1")


def _require(value: object, minimum: int, key: str, accepted: str) -> None:
    # bool is an int subclass; `True` as an interval is a typo, not a value.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{key} is {value!r}; expected {accepted}")
