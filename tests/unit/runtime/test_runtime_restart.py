import random

from sparkpoint.runtime.restart import ExponentialDelay, FailureRate, FixedDelay, restart_strategy_from
from sparkpoint.config import Settings


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_fixed_delay_gives_up_after_attempts():
    s = FixedDelay(attempts=2, delay_ms=100)
    assert [s.on_failure().restart for _ in range(3)] == [True, True, False]
    assert "attempts used up" in s.on_failure().why


def test_exponential_delay_grows_caps_and_resets_after_quiet_period():
    clock = Clock()
    s = ExponentialDelay(100, 1000, 2.0, reset_threshold_ms=10_000, jitter=0.0, attempts=100, clock=clock,
                         rng=random.Random(1))
    delays = [s.on_failure().delay_ms for _ in range(6)]
    assert delays == [100, 200, 400, 800, 1000, 1000]
    clock.t += 11  # a long healthy run
    assert s.on_failure().delay_ms == 100


def test_failure_rate_refuses_past_rate_in_window():
    clock = Clock()
    s = FailureRate(max_failures=2, interval_ms=10_000, delay_ms=5, clock=clock)
    assert s.on_failure().restart and s.on_failure().restart
    assert not s.on_failure().restart
    clock.t += 20
    assert s.on_failure().restart


def test_strategy_from_flink_keys():
    st = restart_strategy_from(Settings.load(sets=["restart-strategy.type=none"]))
    assert not st.on_failure().restart
    st = restart_strategy_from(Settings.load(sets=["restart-strategy.type=fixed-delay",
                                                   "restart-strategy.fixed-delay.attempts=1"]))
    assert st.on_failure().restart and not st.on_failure().restart
