"""Restart strategies, with Flink's names and options: fixed-delay,
exponential-delay, failure-rate, none. Each answers one question after a failure:
restart, and after how long?"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from sparkpoint.config import Settings


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    delay_ms: int = 0
    why: str = ""


class RestartStrategy:
    name = "none"

    def on_failure(self) -> RestartDecision:
        return RestartDecision(False, why="restart-strategy.type is none")


@dataclass
class FixedDelay(RestartStrategy):
    attempts: int
    delay_ms: int
    failures: int = 0
    name = "fixed-delay"

    def on_failure(self) -> RestartDecision:
        self.failures += 1
        if self.failures > self.attempts:
            return RestartDecision(False, why=f"fixed-delay: {self.attempts} restart attempts used up")
        return RestartDecision(True, self.delay_ms, f"fixed-delay attempt {self.failures}/{self.attempts}")


@dataclass
class ExponentialDelay(RestartStrategy):
    initial_ms: int
    max_ms: int
    multiplier: float
    reset_threshold_ms: int
    jitter: float
    attempts: int
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)
    current_ms: float = 0
    attempt: int = 0
    last_failure: float | None = None
    name = "exponential-delay"

    def on_failure(self) -> RestartDecision:
        now = self.clock()
        # A job that ran long enough without failing starts over with the initial backoff.
        if self.last_failure is not None and (now - self.last_failure) * 1000 >= self.reset_threshold_ms:
            self.current_ms, self.attempt = 0, 0
        self.last_failure = now
        self.attempt += 1
        if self.attempt > self.attempts:
            return RestartDecision(False, why=f"exponential-delay: {self.attempts} attempts before reset used up")
        self.current_ms = self.initial_ms if self.current_ms == 0 else min(self.current_ms * self.multiplier, self.max_ms)
        spread = self.current_ms * self.jitter
        delay = max(0, int(self.current_ms + self.rng.uniform(-spread, spread)))
        return RestartDecision(True, delay, f"exponential-delay attempt {self.attempt}, backoff {delay} ms")


@dataclass
class FailureRate(RestartStrategy):
    max_failures: int
    interval_ms: int
    delay_ms: int
    clock: Callable[[], float] = time.monotonic
    failures: deque = field(default_factory=deque)
    name = "failure-rate"

    def on_failure(self) -> RestartDecision:
        now = self.clock()
        self.failures.append(now)
        while self.failures and (now - self.failures[0]) * 1000 > self.interval_ms:
            self.failures.popleft()
        if len(self.failures) > self.max_failures:
            return RestartDecision(False, why=f"failure-rate: more than {self.max_failures} failures within "
                                              f"{self.interval_ms} ms")
        return RestartDecision(True, self.delay_ms, f"failure-rate: {len(self.failures)}/{self.max_failures} in window")


def restart_strategy_from(settings: Settings) -> RestartStrategy:
    kind = settings.restart_strategy
    if kind == "fixed-delay":
        return FixedDelay(settings.fixed_delay_attempts, settings.fixed_delay_ms)
    if kind == "exponential-delay":
        return ExponentialDelay(settings.exp_initial_backoff_ms, settings.exp_max_backoff_ms, settings.exp_multiplier,
                                settings.exp_reset_threshold_ms, settings.exp_jitter, settings.exp_attempts)
    if kind == "failure-rate":
        return FailureRate(settings.failure_rate_max, settings.failure_rate_interval_ms, settings.failure_rate_delay_ms)
    return RestartStrategy()
