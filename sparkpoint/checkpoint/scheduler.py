"""Timers for the coordinator: a manual clock for tests, a timer thread with workers
for production.

Both satisfy `sparkpoint.checkpoint.interfaces.Scheduler`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger(__name__)


@dataclass(eq=False)
class ScheduledTask:
    """A timer; `cancel()` stops it from running (again). Safe from any thread."""

    fn: Callable[[], None]
    due_ms: int
    period_ms: int | None = None
    cancelled: bool = field(default=False)

    def cancel(self) -> None:
        self.cancelled = True


class _TimerHeap:
    """Due tasks in (due time, insertion order): equal due times run in the order scheduled."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, ScheduledTask]] = []
        self._seq = itertools.count()

    def push(self, task: ScheduledTask) -> None:
        heapq.heappush(self._heap, (task.due_ms, next(self._seq), task))

    def next_due_ms(self) -> int | None:
        self._drop_cancelled()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int) -> ScheduledTask | None:
        self._drop_cancelled()
        if self._heap and self._heap[0][0] <= now_ms:
            return heapq.heappop(self._heap)[2]
        return None

    def __len__(self) -> int:
        self._drop_cancelled()
        return sum(1 for _, _, t in self._heap if not t.cancelled)

    def clear(self) -> None:
        self._heap.clear()

    def _drop_cancelled(self) -> None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)


def _check_delay(name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{name} must be >= 0 ms, got {value}")


class ManualScheduler:
    """Time moves only when a test calls `advance(ms)`; due timers then run in order,
    in the caller's thread, each seeing `now_ms()` equal to its due time.

    An exception raised by a timer propagates out of `advance` so tests see bugs."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now_ms = start_ms
        self._timers = _TimerHeap()
        self._lock = threading.RLock()

    def now_ms(self) -> int:
        return self._now_ms

    def schedule(self, delay_ms: int, fn: Callable[[], None]) -> ScheduledTask:
        _check_delay("delay", delay_ms)
        task = ScheduledTask(fn, self._now_ms + delay_ms)
        with self._lock:
            self._timers.push(task)
        return task

    def schedule_at_fixed_rate(self, initial_delay_ms: int, period_ms: int,
                               fn: Callable[[], None]) -> ScheduledTask:
        _check_delay("initial delay", initial_delay_ms)
        if period_ms <= 0:
            raise ValueError(f"period must be > 0 ms, got {period_ms}")
        task = ScheduledTask(fn, self._now_ms + initial_delay_ms, period_ms)
        with self._lock:
            self._timers.push(task)
        return task

    def advance(self, ms: int) -> None:
        """Move the clock forward by `ms`, running every timer that falls due on the way
        (including timers those timers schedule within the window)."""
        _check_delay("advance", ms)
        target = self._now_ms + ms
        while True:
            with self._lock:
                task = self._timers.pop_due(target)
                if task is None:
                    break
                self._now_ms = max(self._now_ms, task.due_ms)
                if task.period_ms is not None:
                    task.due_ms += task.period_ms
                    self._timers.push(task)
            task.fn()
        self._now_ms = target

    def run_due(self) -> None:
        """Run timers due now (delay 0) without moving the clock."""
        self.advance(0)

    def next_due_ms(self) -> int | None:
        with self._lock:
            return self._timers.next_due_ms()

    def pending_timers(self) -> int:
        with self._lock:
            return len(self._timers)


class ThreadScheduler:
    """A timer thread that hands due timers to worker threads.

    Timers are kept on the monotonic clock, so wall-clock jumps neither fire nor
    stall them. `now_ms()` is epoch milliseconds that advance monotonically
    (wall clock at construction plus monotonic time since), so timestamps in
    checkpoint metadata are readable dates.

    The timer thread never runs a timer itself: a timer stuck in a hung storage call or
    a slow callback must not hold up the others (a checkpoint's expiry
    must not wait for a stalled trigger). Workers are started on demand and stop after
    `idle_s` without work. A periodic timer never runs twice at once: a run that falls
    due while the previous one is still running is skipped, and a periodic timer that
    falls behind skips the missed runs instead of firing back to back (a checkpoint
    trigger has nothing to catch up on). A timer cancelled after it fell due but before
    a worker picked it up does not run. A timer that raises is logged and, if periodic,
    keeps running.
    """

    def __init__(self, name: str = "sparkpoint-checkpoint-timer", idle_s: float = 30.0) -> None:
        self._name = name
        self._idle_s = idle_s
        self._origin_wall_ms = int(time.time() * 1000)
        self._origin_mono_ns = time.monotonic_ns()
        self._timers = _TimerHeap()
        self._cond = threading.Condition()
        self._stopped = False
        self._running: set[ScheduledTask] = set()  # periodic tasks with a run in progress
        self._work: deque[ScheduledTask] = deque()
        self._work_cond = threading.Condition()
        self._idle_workers = 0
        self._worker_seq = itertools.count(1)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def now_ms(self) -> int:
        return self._origin_wall_ms + (time.monotonic_ns() - self._origin_mono_ns) // 1_000_000

    def schedule(self, delay_ms: int, fn: Callable[[], None]) -> ScheduledTask:
        _check_delay("delay", delay_ms)
        return self._add(ScheduledTask(fn, self.now_ms() + delay_ms))

    def schedule_at_fixed_rate(self, initial_delay_ms: int, period_ms: int,
                               fn: Callable[[], None]) -> ScheduledTask:
        _check_delay("initial delay", initial_delay_ms)
        if period_ms <= 0:
            raise ValueError(f"period must be > 0 ms, got {period_ms}")
        return self._add(ScheduledTask(fn, self.now_ms() + initial_delay_ms, period_ms))

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the timer thread; timers not yet run never run. Timers already running
        finish on their worker. Idempotent."""
        with self._cond:
            self._stopped = True
            self._timers.clear()
            self._cond.notify_all()
        with self._work_cond:
            self._work.clear()
            self._work_cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _add(self, task: ScheduledTask) -> ScheduledTask:
        with self._cond:
            if self._stopped:
                # The coordinator may race with shutdown; a timer that never runs is
                # the right outcome then, not an error.
                log.debug("scheduler is shut down; timer dropped")
                task.cancel()
                return task
            self._timers.push(task)
            self._cond.notify_all()
        return task

    def _run(self) -> None:
        while True:
            with self._cond:
                task = None
                while not self._stopped:
                    now = self.now_ms()
                    task = self._timers.pop_due(now)
                    if task is not None:
                        break
                    due = self._timers.next_due_ms()
                    self._cond.wait(None if due is None else (due - now) / 1000)
                if self._stopped:
                    return
                assert task is not None
                if task.period_ms is not None:
                    task.due_ms = max(task.due_ms + task.period_ms, self.now_ms())
                    self._timers.push(task)
                    if task in self._running:
                        log.debug("periodic timer %r still running; this run is skipped", task.fn)
                        continue
                    self._running.add(task)
            self._dispatch(task)

    def _dispatch(self, task: ScheduledTask) -> None:
        with self._work_cond:
            if self._stopped:
                return
            self._work.append(task)
            if len(self._work) > self._idle_workers:
                threading.Thread(target=self._work_loop, daemon=True,
                                 name=f"{self._name}-{next(self._worker_seq)}").start()
            else:
                self._work_cond.notify()

    def _work_loop(self) -> None:
        while True:
            with self._work_cond:
                while not self._work:
                    if self._stopped:
                        return
                    self._idle_workers += 1
                    try:
                        self._work_cond.wait(self._idle_s)
                    finally:
                        self._idle_workers -= 1
                    if not self._work and not self._stopped:
                        # Idle for idle_s (or woken for work another worker took): leave;
                        # `_dispatch` starts a new worker whenever none is idle.
                        return
                task = self._work.popleft()
            try:
                if not task.cancelled:
                    task.fn()
            except Exception:
                log.exception("checkpoint timer %r failed; the scheduler keeps running", task.fn)
            finally:
                if task.period_ms is not None:
                    with self._cond:
                        self._running.discard(task)
