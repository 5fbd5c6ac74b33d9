"""Window steps with several Spark SQL aggregates (splittable and buffered, filtered)
against the brute-force window references of windows_support, over randomized
out-of-order epochs with late rows, both output modes, and a snapshot and restore
midway."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from windows_support import (cumulate_windows_of, fixed_reference, random_epochs, run_in_tester, session_reference,
                             sliding_windows_of, stored_entries)

from sparkpoint import CumulateWindow, SessionWindow, SlidingWindow, TumblingWindow
from sparkpoint.errors import ConfigError
from sparkpoint.testing import ProcessorTester

DELAY = 2_000
AGGS = ["count(*) AS n", "sum(v) AS total", "avg(v) AS mean", "max(s) AS hi_s", "count(DISTINCT s) AS ds",
        "count(*) FILTER (WHERE cheap) AS n_cheap", "count(DISTINCT s) FILTER (WHERE cheap) AS ds_cheap",
        "collect_set(s) AS ss", "percentile_approx(v, 0.5) AS med"]
NAMES = [a.rsplit(" AS ", 1)[1] for a in AGGS]
COLUMNS = ["k", "window_start", "window_end", *NAMES, "late"]


def with_strings(epochs: list[pd.DataFrame]) -> list[pd.DataFrame]:
    """A string column (with nulls where v is null) and a boolean one, from v."""
    out = []
    for rows in epochs:
        rows = rows.copy()
        rows["s"] = [None if v != v else "pqrs"[int(v) % 4] for v in rows["v"]]
        rows["cheap"] = [v == v and v < 20 for v in rows["v"]]
        out.append(rows)
    return out


def summarize(values: list[tuple]) -> tuple:
    vs = sorted(v for v, _, _ in values if v is not None)
    ss = {s for _, s, _ in values if s is not None}
    cheap = [(v, s) for v, s, c in values if c]
    med = vs[min(max(math.ceil(0.5 * len(vs)) - 1, 0), len(vs) - 1)] if vs else None
    return (len(values), sum(vs) if vs else None, sum(vs) / len(vs) if vs else None, max(ss) if ss else None,
            len(ss), len(cheap), len({s for _, s in cheap if s is not None}), tuple(sorted(ss)), med)


@pytest.mark.parametrize("lateness", [0, 3_000], ids=["no-lateness", "lateness"])
@pytest.mark.parametrize("mode", ["final", "update"])
def test_sliding_windows_with_sql_aggregates_equal_the_reference_and_survive_a_restore(mode: str,
                                                                                         lateness: int) -> None:
    epochs = with_strings(random_epochs(seed=21 + lateness))

    def step() -> SlidingWindow:
        return SlidingWindow("hop", ["k"], "ts", size=10_000, slide=4_000, aggs=AGGS, allowed_lateness=lateness,
                             output_mode=mode)
    expected, expected_dropped = fixed_reference(epochs, sliding_windows_of(10_000, 4_000), DELAY, lateness, mode,
                                                 ("v", "s", "cheap"), summarize)
    out, dropped, _ = run_in_tester(step, epochs, DELAY, columns=COLUMNS)
    assert out == expected and dropped == expected_dropped
    assert expected_dropped > 0 and sum(map(len, expected)) > 20
    restored = run_in_tester(step, epochs, DELAY, snapshot_after=3, columns=COLUMNS)
    assert restored[:2] == (out, dropped)


@pytest.mark.parametrize("lateness", [0, 3_000], ids=["no-lateness", "lateness"])
@pytest.mark.parametrize("mode", ["final", "update"])
def test_tumbling_windows_with_sql_aggregates_equal_the_reference_and_survive_a_restore(mode: str,
                                                                                          lateness: int) -> None:
    epochs = with_strings(random_epochs(seed=41 + lateness))

    def step():
        return TumblingWindow("tumble", ["k"], "ts", size="5 s", aggs=AGGS, allowed_lateness=lateness,
                              output_mode=mode)
    expected, expected_dropped = fixed_reference(epochs, sliding_windows_of(5_000, 5_000), DELAY, lateness, mode,
                                                 ("v", "s", "cheap"), summarize)
    out, dropped, _ = run_in_tester(step, epochs, DELAY, columns=COLUMNS)
    assert out == expected and dropped == expected_dropped
    assert expected_dropped > 0 and sum(map(len, expected)) > 15
    restored = run_in_tester(step, epochs, DELAY, snapshot_after=3, columns=COLUMNS)
    assert restored[:2] == (out, dropped)


def test_a_tumbling_window_keeps_its_table_state_for_count_and_sum_and_takes_the_engine_for_the_rest():
    from sparkpoint.api.window import TumblingWindow as TableTumblingWindow

    assert type(TumblingWindow("t", ["k"], "ts", size="1 min")) is TableTumblingWindow
    assert type(TumblingWindow("t", ["k"], "ts", size="1 min", aggs=("count", "sum"), value_column="v")) \
        is TableTumblingWindow
    for engine in (TumblingWindow("t", ["k"], "ts", size="1 min", aggs=["count(*) AS n"]),
                   TumblingWindow("t", ["k"], "ts", size="1 min", output_mode="update"),
                   TumblingWindow("t", ["k"], "ts", size="1 min", output_mode="final"),
                   TumblingWindow("t", ["k"], "ts", size_ms=60_000, aggs=("count", "max"), value_column="v")):
        assert isinstance(engine, SlidingWindow) and engine.size_ms == engine.slide_ms == 60_000
    with pytest.raises(ConfigError, match="TumblingWindow 't': aggregate 'sum\\(DISTINCT v\\) AS x' uses sum"):
        TumblingWindow("t", ["k"], "ts", size="1 min", aggs=["sum(DISTINCT v) AS x"])
    with pytest.raises(ConfigError, match="TumblingWindow 't': output_mode must be one of"):
        TumblingWindow("t", ["k"], "ts", size="1 min", output_mode="append")


@pytest.mark.parametrize("mode", ["final", "update"])
def test_cumulate_windows_with_sql_aggregates_equal_the_reference(mode: str) -> None:
    epochs = with_strings(random_epochs(seed=5))

    def step() -> CumulateWindow:
        return CumulateWindow("today", ["k"], "ts", step=3_000, size=12_000, aggs=AGGS, allowed_lateness=2_000,
                              output_mode=mode)
    expected, expected_dropped = fixed_reference(epochs, cumulate_windows_of(3_000, 12_000), DELAY, 2_000, mode,
                                                 ("v", "s", "cheap"), summarize)
    out, dropped, _ = run_in_tester(step, epochs, DELAY, snapshot_after=4, columns=COLUMNS)
    assert out == expected and dropped == expected_dropped
    assert expected_dropped > 0 and sum(map(len, expected)) > 20


@pytest.mark.parametrize("mode", ["final", "update"])
def test_sessions_with_sql_aggregates_equal_the_reference_and_survive_a_restore(mode: str) -> None:
    """Sessions merge stored partials with new ones, also bridging two stored sessions."""
    epochs = with_strings(random_epochs(seed=8))

    def step() -> SessionWindow:
        return SessionWindow("sessions", ["k"], "ts", gap=700, aggs=AGGS, allowed_lateness=1_000, output_mode=mode)
    expected, expected_dropped = session_reference(epochs, lambda r: 700, DELAY, 1_000, mode, ("v", "s", "cheap"),
                                                   summarize)
    out, dropped, _ = run_in_tester(step, epochs, DELAY, columns=COLUMNS)
    assert out == expected and dropped == expected_dropped
    assert expected_dropped > 0 and any(r[-1] for o in expected for r in o)  # late rows dropped, and merged
    restored = run_in_tester(step, epochs, DELAY, snapshot_after=2, columns=COLUMNS)
    assert restored[:2] == (out, dropped)


def test_no_window_state_and_no_partials_are_left_once_the_watermark_passes() -> None:
    tester = ProcessorTester(SlidingWindow("hop", ["k"], "ts", size=10_000, slide=4_000, aggs=AGGS,
                                           allowed_lateness=3_000), watermark=("ts", DELAY))
    for rows in with_strings(random_epochs(seed=7, epochs=4)):
        tester.process(rows)
    assert stored_entries(tester) != []
    tester.advance_watermark(10**9)
    assert stored_entries(tester) == []


def test_one_column_aggregates_and_sql_aggregates_do_not_mix() -> None:
    with pytest.raises(ConfigError, match="or be Spark SQL aggregates"):
        SlidingWindow("hop", ["k"], "ts", size="10 s", slide="5 s", aggs=["count", "sum(v) AS total"],
                      value_column="v")


@pytest.mark.parametrize("before, after", [
    ({}, {"aggs": ["count(*) AS n"]}),
    ({}, {"output_mode": "final"}),
    ({"output_mode": "update"}, {}),
], ids=["table-then-sql", "table-then-mode", "engine-then-table"])
def test_switching_a_tumbling_window_between_its_two_states_is_refused_not_emptied(before, after) -> None:
    import pandas as pd

    rows = pd.DataFrame({"k": ["a", "b", "a"], "ts": [1_000, 2_000, 3_000]})
    first = ProcessorTester(TumblingWindow("tumble", ["k"], "ts", size="10 s", **before), watermark=("ts", 0))
    first.process(rows)
    assert len(first.state()) > 0
    restored = ProcessorTester.from_snapshot(TumblingWindow("tumble", ["k"], "ts", size="10 s", **after),
                                             first.snapshot(), watermark=("ts", 0))
    with pytest.raises(ConfigError, match="TumblingWindow 'tumble': its state was written by a TumblingWindow .*"
                                          "give it a new name to start its state from empty"):
        restored.process(rows)
