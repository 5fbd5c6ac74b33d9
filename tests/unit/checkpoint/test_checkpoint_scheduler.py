from __future__ import annotations

import threading

import pytest

from sparkpoint.checkpoint import ManualScheduler, ThreadScheduler


def test_manual_scheduler_runs_due_timers_in_time_then_insertion_order():
    scheduler = ManualScheduler()
    ran: list[tuple[str, int]] = []
    scheduler.schedule(20, lambda: ran.append(("b", scheduler.now_ms())))
    scheduler.schedule(10, lambda: ran.append(("a", scheduler.now_ms())))
    scheduler.schedule(20, lambda: ran.append(("c", scheduler.now_ms())))
    scheduler.schedule(31, lambda: ran.append(("late", scheduler.now_ms())))
    scheduler.advance(30)
    assert ran == [("a", 10), ("b", 20), ("c", 20)]
    assert scheduler.now_ms() == 30


def test_manual_fixed_rate_timer_and_cancel():
    scheduler = ManualScheduler()
    ticks: list[int] = []
    task = scheduler.schedule_at_fixed_rate(5, 10, lambda: ticks.append(scheduler.now_ms()))
    scheduler.advance(35)
    assert ticks == [5, 15, 25, 35]
    task.cancel()
    scheduler.advance(100)
    assert ticks == [5, 15, 25, 35]
    assert scheduler.pending_timers() == 0


def test_timers_scheduled_by_timers_run_within_the_same_advance():
    scheduler = ManualScheduler()
    ran: list[int] = []
    scheduler.schedule(5, lambda: scheduler.schedule(5, lambda: ran.append(scheduler.now_ms())))
    scheduler.advance(10)
    assert ran == [10]


def test_manual_scheduler_rejects_negative_delays():
    with pytest.raises(ValueError):
        ManualScheduler().schedule(-1, lambda: None)


def test_thread_scheduler_runs_timers_and_skips_cancelled_ones():
    scheduler = ThreadScheduler()
    try:
        ran: list[str] = []
        done = threading.Event()
        cancelled = scheduler.schedule(10, lambda: ran.append("cancelled"))
        cancelled.cancel()
        scheduler.schedule(30, lambda: (ran.append("ran"), done.set()))
        assert done.wait(5)
        assert ran == ["ran"]
    finally:
        scheduler.shutdown()


def test_thread_scheduler_fixed_rate_survives_a_raising_timer_and_stops_on_shutdown():
    scheduler = ThreadScheduler()
    calls: list[int] = []
    third = threading.Event()

    def tick() -> None:
        calls.append(1)
        if len(calls) == 3:
            third.set()
        raise RuntimeError("a broken trigger")

    scheduler.schedule_at_fixed_rate(0, 2, tick)
    assert third.wait(5)
    scheduler.shutdown()
    after = len(calls)
    assert scheduler.schedule(0, lambda: calls.append(99)).cancelled  # dropped after shutdown
    assert 99 not in calls and len(calls) == after


def test_thread_scheduler_now_is_epoch_milliseconds_that_never_go_back():
    scheduler = ThreadScheduler()
    try:
        first = scheduler.now_ms()
        assert first > 1_600_000_000_000
        assert scheduler.now_ms() >= first
    finally:
        scheduler.shutdown()


def test_thread_scheduler_runs_other_timers_while_one_timer_is_stalled():
    """A timer stuck in a hung storage call must not hold up the others
    (another checkpoint's expiry fired only after the stall ended)."""
    scheduler = ThreadScheduler()
    release = threading.Event()
    stalled = threading.Event()
    fired = threading.Event()
    try:
        scheduler.schedule(0, lambda: (stalled.set(), release.wait(10)))
        assert stalled.wait(5)
        scheduler.schedule(10, fired.set)
        assert fired.wait(5), "a stalled timer blocked every other timer"
    finally:
        release.set()
        scheduler.shutdown()


def test_thread_scheduler_never_overlaps_runs_of_one_periodic_timer():
    """A periodic timer still running when it falls due again skips that run instead of
    starting a second, concurrent run (as Java's scheduleAtFixedRate)."""
    scheduler = ThreadScheduler()
    release = threading.Event()
    running = 0
    most = 0
    runs = 0
    lock = threading.Lock()
    first = threading.Event()

    def tick() -> None:
        nonlocal running, most, runs
        with lock:
            running += 1
            runs += 1
            most = max(most, running)
        first.set()
        release.wait(10)
        with lock:
            running -= 1

    try:
        scheduler.schedule_at_fixed_rate(0, 2, tick)
        assert first.wait(5)
        threading.Event().wait(0.1)  # ~50 periods fall due while the first run is stuck
        assert runs == 1 and most == 1
    finally:
        release.set()
        scheduler.shutdown()
