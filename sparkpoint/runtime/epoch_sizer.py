"""Epochs sized by time (`sparkpoint.epoch.target-duration`).

A checkpoint completes at the end of the epoch its trigger falls in, and exactly-once
output becomes visible with it, so checkpoint duration and output latency are about
half an epoch plus the barrier work. Sources bound an epoch by records (or files);
how long that takes depends on the machine, the keys and the state. With a target
duration the epoch loop shrinks the sources' slices until epochs take about that long,
and lets them grow back (at most doubling per epoch) when they are shorter.

An epoch costs a fixed part (planning, task start, store commits) plus a part per
record. The update `budget := size * target / duration` converges on the size whose
duration is the target when the fixed part is below it; when it is not, the budget
stops at a floor (1/64 of the largest slice a source planned) and this is logged once,
since no epoch size can then meet the target.

Without a target the sizer still runs, as a ceiling (`sparkpoint.epoch.max-duration`,
by default a quarter of `execution.checkpointing.timeout`): epochs keep the sources' own
limits until one takes longer than the ceiling, and then the next ones aim at half of
it. A checkpoint triggered during an epoch is carried by the next one and completes
when that one ends, so it spans at most two epochs: with epochs under a quarter of the
timeout, a slow step (a Python processor taking seconds per thousand rows) slows the
job down instead of making every checkpoint expire.

Pure logic: it sees plan sizes and durations, never Spark.
"""

from __future__ import annotations

import logging
import math

log = logging.getLogger(__name__)

FLOOR_DIVISOR = 64  # the smallest budget, as a fraction of the largest slice planned
_MAX_GROWTH = 2.0  # per epoch
_MAX_SHRINK = 0.25  # per epoch: the first epoch pays the JVM's warm-up, not a steady cost


class EpochSizer:
    """Holds the record (or file) budget of the next epoch; None = the sources' own limits."""

    def __init__(self, target_ms: int, *, ceiling_ms: int | None = None):
        if target_ms <= 0:
            raise ValueError("target_ms must be greater than 0")
        self.target_s = target_ms / 1000
        # Ceiling mode: epochs are not cut until one takes longer than the ceiling.
        self.ceiling_s = ceiling_ms / 1000 if ceiling_ms else None
        self.budget: int | None = None
        self._largest_plan = 0
        self._floor_logged = False
        self._ceiling_logged = False

    @classmethod
    def ceiling(cls, ceiling_ms: int) -> "EpochSizer":
        """Epochs as long as the sources allow, cut to half of `ceiling_ms` once one is longer."""
        return cls(max(1, ceiling_ms // 2), ceiling_ms=ceiling_ms)

    def limit(self, planned: int) -> int:
        """How many of the `planned` units (records, files) the next epoch takes."""
        self._largest_plan = max(self._largest_plan, planned)
        return planned if self.budget is None else min(planned, self.budget)

    def observe(self, size: int, planned: int, duration_s: float) -> None:
        """An epoch of `size` units took `duration_s`; its source had `planned` available
        within its own limits (more than `size` when this sizer cut the slice)."""
        if size <= 0 or duration_s <= 0:
            return
        ideal = size * self.target_s / duration_s
        if self.ceiling_s is not None and self.budget is None and duration_s <= self.ceiling_s:
            return  # under the ceiling and not cutting: the sources' own limits stand
        if self.ceiling_s is not None and duration_s > self.ceiling_s:
            # Past the ceiling the next checkpoint is at risk: go straight to the target.
            new = max(ideal, size / FLOOR_DIVISOR)
            if not self._ceiling_logged:
                self._ceiling_logged = True
                log.warning("an epoch of %d units took %.1f s, more than sparkpoint.epoch.max-duration=%.1f s (by "
                            "default a quarter of execution.checkpointing.timeout, so that checkpoints complete in "
                            "time): the next epochs read about %d units. The job runs slower rather than failing "
                            "its checkpoints; speed up the slow step or raise execution.checkpointing.timeout",
                            size, duration_s, self.ceiling_s, int(new))
        elif duration_s > self.target_s:
            new = max(ideal, size * _MAX_SHRINK)
        elif self.budget is not None and planned > size:
            # Cut by this budget and still short: there is room to grow.
            new = min(ideal, size * _MAX_GROWTH)
        else:
            return  # short because the source had no more: nothing learnt about the budget
        floor = max(1, math.ceil(self._largest_plan / FLOOR_DIVISOR))
        if new < floor and not self._floor_logged:
            self._floor_logged = True
            key = "sparkpoint.epoch.max-duration (half of it)" if self.ceiling_s else "sparkpoint.epoch.target-duration"
            log.warning("epochs of %d units take %.0f ms, more than %s=%.0f ms; the fixed cost of an epoch is close "
                        "to the target, so epochs stay at %d units (1/%d of the sources' limit). Raise the target to "
                        "keep throughput", size, duration_s * 1000, key, self.target_s * 1000, floor, FLOOR_DIVISOR)
        budget = max(floor, int(new))
        self.budget = None if budget >= self._largest_plan and duration_s <= self.target_s else budget
