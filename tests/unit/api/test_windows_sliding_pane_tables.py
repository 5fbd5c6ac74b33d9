"""SlidingWindow's pane tables (one Arrow table of panes per key group) against the
per-window engine they replace for one-column aggregates: the same rows epoch by epoch,
the same rows dropped, the same state read back, over randomized out-of-order epochs
with late rows; and a store the engine wrote keeps the engine."""

from __future__ import annotations

import pytest
from windows_support import (AGGREGATE_SETS, AGGS, as_rows, engine_then_tables, fixed_reference, random_epochs,
                             run_beside_the_engine, run_in_tester, sliding_windows_of, states_beside_the_engine,
                             stored_entries, stored_namespaces)

from sparkpoint import SlidingWindow
from sparkpoint.api.windows.pane_table_state import PaneTables
from sparkpoint.api.windows.panes import PaneWindow
from sparkpoint.state.keys import namespace
from sparkpoint.testing import ProcessorTester

DELAY = 2_000
_PANES, _RECORDS = namespace("hop-panes"), namespace("hop")


class EngineSliding(SlidingWindow):
    """The per-window engine, whatever the store holds."""

    def apply(self, store, rows, ctx):
        return PaneWindow.apply(self, store, rows, ctx)


def _step(cls, mode: str, lateness: int, size: int, slide: int, aggs=AGGS, value_type: str = "double"):
    return cls("hop", ["k"], "ts", size=size, slide=slide, aggs=aggs,
               value_column=None if aggs == ("count",) else "v", allowed_lateness=lateness, output_mode=mode,
               value_type=value_type)


@pytest.mark.parametrize("size,slide", [(10_000, 5_000), (10_000, 4_000), (6_000, 6_000), (30_000, 2_000)],
                         ids=["slide-divides-size", "pane-is-gcd", "tumbling", "fifteen-windows"])
@pytest.mark.parametrize("lateness", [0, 3_000], ids=["no-lateness", "lateness"])
@pytest.mark.parametrize("mode", ["final", "update"])
def test_pane_tables_emit_what_the_per_window_engine_emits_epoch_by_epoch(mode, lateness, size, slide) -> None:
    epochs = random_epochs(seed=size + slide + lateness + 1, epochs=9, keys="abcdefg", jitter=size + 10_000)
    out, dropped = run_beside_the_engine(lambda: _step(SlidingWindow, mode, lateness, size, slide),
                                         lambda: _step(EngineSliding, mode, lateness, size, slide), epochs, DELAY)
    assert dropped > 0 or size > 10_000  # late rows beyond the lateness (long windows: rarely)
    expected, expected_dropped = fixed_reference(epochs, sliding_windows_of(size, slide), DELAY, lateness, mode)
    assert (out, dropped) == (expected, expected_dropped)


@AGGREGATE_SETS
@pytest.mark.parametrize("mode", ["final", "update"])
def test_pane_tables_equal_the_engine_for_each_aggregate_set(mode, aggs, value_type, columns) -> None:
    epochs = random_epochs(seed=11, epochs=9, keys="abcde")

    def run(cls):
        return run_in_tester(lambda: _step(cls, mode, 3_000, 10_000, 4_000, aggs, value_type), epochs, DELAY,
                             columns=columns)[:2]
    assert run(SlidingWindow) == run(EngineSliding)


@pytest.mark.parametrize("mode", ["final", "update"])
def test_a_sliding_window_keeps_one_pane_table_per_key_group_and_no_per_window_entries(mode) -> None:
    tester = ProcessorTester(_step(SlidingWindow, mode, 3_000, 10_000, 5_000), watermark=("ts", DELAY))
    for rows in random_epochs(seed=3, epochs=4, keys="abcdefgh"):
        tester.process(rows)
    assert stored_namespaces(tester) == {_PANES}
    assert len(stored_entries(tester)) <= 8  # at most one entry per key group, and 8 keys


@pytest.mark.parametrize("mode", ["final", "update"])
def test_a_store_the_per_window_engine_wrote_keeps_the_engine_after_a_restore(mode) -> None:
    epochs = random_epochs(seed=5, epochs=8)
    out, tester = engine_then_tables(lambda: _step(EngineSliding, mode, 3_000, 10_000, 4_000),
                                     lambda: _step(SlidingWindow, mode, 3_000, 10_000, 4_000), epochs, DELAY)
    assert stored_namespaces(tester) == {_RECORDS, namespace("hop-due")}
    out.append(as_rows(tester.finish()))
    expected, expected_dropped = fixed_reference(epochs, sliding_windows_of(10_000, 4_000), DELAY, 3_000, mode)
    assert (out, tester.late_rows_dropped) == (expected, expected_dropped)


@pytest.mark.parametrize("mode", ["final", "update"])
def test_the_state_reader_reads_pane_tables_as_the_engine_held_its_windows(mode) -> None:
    """Windows held, their totals, fired flags and timers; `late` is not kept by pane tables."""
    state_columns = ["k", "window_start", "window_end", "count", "sum", "min", "max", "avg", "fired"]
    for states, timers in states_beside_the_engine(lambda: _step(SlidingWindow, mode, 3_000, 10_000, 4_000),
                                                   PaneTables, random_epochs(seed=9, epochs=8), DELAY, state_columns):
        assert states[0] == states[1] and states[0]
        assert timers[0] == timers[1]
