"""CumulateWindow's pane tables (one Arrow table of panes per key group) against the
per-window engine they replace for one-column aggregates: the same rows epoch by epoch,
the same rows dropped, the same state read back, over randomized out-of-order epochs
with late rows; and a store the engine wrote keeps the engine."""

from __future__ import annotations

import random

import numpy as np
import pytest
from windows_support import (AGGREGATE_SETS, AGGS, as_rows, cumulate_windows_of, engine_then_tables, fixed_reference,
                             random_epochs, run_beside_the_engine, run_in_subtasks, run_in_tester,
                             states_beside_the_engine, stored_entries, stored_namespaces)

from sparkpoint import CumulateWindow, SlidingWindow
from sparkpoint.api.windows.pane_table_state import PaneTables
from sparkpoint.api.windows.panes import PaneWindow
from sparkpoint.state.keys import namespace
from sparkpoint.testing import ProcessorTester

DELAY = 2_000
_PANES, _RECORDS = namespace("cumulate-panes"), namespace("cumulate")


class EngineCumulate(CumulateWindow):
    """The per-window engine, whatever the store holds."""

    def apply(self, store, rows, ctx):
        return PaneWindow.apply(self, store, rows, ctx)


def _step(cls, mode: str, lateness: int, step: int, size: int, aggs=AGGS, value_type: str = "double"):
    return cls("cumulate", ["k"], "ts", step=step, size=size, aggs=aggs,
               value_column=None if aggs == ("count",) else "v", allowed_lateness=lateness, output_mode=mode,
               value_type=value_type)


@pytest.mark.parametrize("step,size", [(10_000, 60_000), (3_000, 12_000), (5_000, 5_000), (4_000, 8_000)],
                         ids=["six-steps", "four-steps", "step-is-size", "two-steps"])
@pytest.mark.parametrize("lateness", [0, 3_000], ids=["no-lateness", "lateness"])
@pytest.mark.parametrize("mode", ["final", "update"])
def test_pane_tables_emit_what_the_per_window_engine_emits_epoch_by_epoch(mode, lateness, step, size) -> None:
    epochs = random_epochs(seed=step + size + lateness + 1, epochs=9, keys="abcdefg", jitter=step + 10_000)
    out, dropped = run_beside_the_engine(lambda: _step(CumulateWindow, mode, lateness, step, size),
                                         lambda: _step(EngineCumulate, mode, lateness, step, size), epochs, DELAY)
    assert dropped > 0 or size > 12_000  # late rows beyond the lateness (long periods: rarely)
    expected, expected_dropped = fixed_reference(epochs, cumulate_windows_of(step, size), DELAY, lateness, mode)
    assert (out, dropped) == (expected, expected_dropped)
    assert out[-1] or mode == "update"  # the end of input fires what the watermark had not reached


@AGGREGATE_SETS
@pytest.mark.parametrize("mode", ["final", "update"])
def test_pane_tables_equal_the_engine_for_each_aggregate_set(mode, aggs, value_type, columns) -> None:
    epochs = random_epochs(seed=11, epochs=9, keys="abcde")

    def run(cls):
        return run_in_tester(lambda: _step(cls, mode, 3_000, 3_000, 12_000, aggs, value_type), epochs, DELAY,
                             columns=columns)[:2]
    assert run(CumulateWindow) == run(EngineCumulate)


@pytest.mark.parametrize("mode", ["final", "update"])
def test_pane_tables_split_over_three_subtasks_equal_the_reference(tmp_path, mode) -> None:
    """Each subtask reads, fires and cleans up only its own key groups' tables."""
    epochs = random_epochs(seed=4, keys="abcdefgh")
    expected, _ = fixed_reference(epochs, cumulate_windows_of(3_000, 12_000), DELAY, 3_000, mode)
    step = _step(CumulateWindow, mode, 3_000, 3_000, 12_000)
    assert run_in_subtasks(tmp_path, step, epochs, DELAY, parallelism=3) == expected


@pytest.mark.parametrize("mode", ["final", "update"])
def test_a_cumulate_window_keeps_one_pane_table_per_key_group_and_no_per_window_entries(mode) -> None:
    tester = ProcessorTester(_step(CumulateWindow, mode, 3_000, 3_000, 12_000), watermark=("ts", DELAY))
    for rows in random_epochs(seed=3, epochs=4, keys="abcdefgh"):
        tester.process(rows)
    assert stored_namespaces(tester) == {_PANES}
    assert len(stored_entries(tester)) <= 8  # at most one entry per key group, and 8 keys
    tester.advance_watermark(10**9)
    assert stored_entries(tester) == []


@pytest.mark.parametrize("mode", ["final", "update"])
def test_a_store_the_per_window_engine_wrote_keeps_the_engine_after_a_restore(mode) -> None:
    epochs = random_epochs(seed=5, epochs=8)
    out, tester = engine_then_tables(lambda: _step(EngineCumulate, mode, 3_000, 3_000, 12_000),
                                     lambda: _step(CumulateWindow, mode, 3_000, 3_000, 12_000), epochs, DELAY)
    assert stored_namespaces(tester) == {_RECORDS, namespace("cumulate-due")}
    out.append(as_rows(tester.finish()))
    expected, expected_dropped = fixed_reference(epochs, cumulate_windows_of(3_000, 12_000), DELAY, 3_000, mode)
    assert (out, tester.late_rows_dropped) == (expected, expected_dropped)


@pytest.mark.parametrize("mode", ["final", "update"])
def test_the_state_reader_reads_pane_tables_as_the_engine_held_its_windows(mode) -> None:
    """Windows held, their totals, fired flags and timers; `late` is not kept by pane tables."""
    state_columns = ["k", "window_start", "window_end", "count", "sum", "min", "max", "avg", "fired"]
    for states, timers in states_beside_the_engine(lambda: _step(CumulateWindow, mode, 3_000, 3_000, 12_000),
                                                   PaneTables, random_epochs(seed=9, epochs=8), DELAY, state_columns):
        assert states[0] == states[1] and states[0]
        assert timers[0] == timers[1]


@pytest.mark.parametrize("make", [
    lambda: CumulateWindow("c", ["k"], "ts", step=3_000, size=12_000),
    lambda: CumulateWindow("c", ["k"], "ts", step=5_000, size=5_000),
    lambda: SlidingWindow("s", ["k"], "ts", size=10_000, slide=4_000),
    lambda: SlidingWindow("s", ["k"], "ts", size=30_000, slide=2_000)],
    ids=["cumulate", "cumulate-one-step", "sliding-pane-is-gcd", "sliding-fifteen-windows"])
def test_whether_a_window_is_due_agrees_with_listing_every_window(make) -> None:
    """What a group's due check answers without listing windows equals the answer from
    every (pane, window) pair `assign` lists, and a pane goes when its last window does."""
    op = make()
    rnd = random.Random(7)
    never = -(1 << 63)
    for _ in range(300):
        panes = np.array(sorted({rnd.randrange(-40, 60) * op.pane_ms for _ in range(rnd.randrange(1, 5))}),
                         dtype=np.int64)
        _, starts, ends = op.assign(panes)
        since = never if rnd.random() < 0.2 else rnd.randrange(-200_000, 300_000)
        until = rnd.randrange(-200_000, 300_000)
        assert op.window_ends_in(panes, [(since, until)]) == bool(((ends > since) & (ends <= until)).any())
        which, _, ends_of = op.assign(panes)
        assert op.last_window_end(panes).tolist() == [int(ends_of[which == i].max()) for i in range(len(panes))]
        assert op.window_starts(ends).tolist() == starts.tolist()
