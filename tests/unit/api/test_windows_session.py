"""SessionWindow against a reference that rebuilds each key's sessions from its rows
every epoch, over randomized out-of-order epochs (rows that bridge sessions, rows
behind the watermark), with a fixed gap and a gap per row, in the tester."""

from __future__ import annotations

import pandas as pd
import pytest
from windows_support import AGGS, random_epochs, run_in_subtasks, run_in_tester, session_reference, stored_entries

from sparkpoint import SessionWindow
from sparkpoint.errors import ConfigError
from sparkpoint.testing import ProcessorTester

DELAY = 2_000
GAP = 1_500


def session(mode: str, lateness: int, dynamic: bool) -> SessionWindow:
    gap = {"gap_column": "gap"} if dynamic else {"gap": GAP}
    return SessionWindow("sessions", ["k"], "ts", aggs=AGGS, value_column="v", allowed_lateness=lateness,
                         output_mode=mode, **gap)


def gap_of(dynamic: bool):
    if not dynamic:
        return lambda r: GAP
    return lambda r: None if pd.isna(r.gap) else int(r.gap)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed-gap", "gap-column"])
@pytest.mark.parametrize("lateness", [0, 3_000], ids=["no-lateness", "lateness"])
@pytest.mark.parametrize("mode", ["final", "update"])
def test_sessions_equal_a_reference_rebuilt_from_the_rows_and_a_restore_midway_changes_nothing(
        mode: str, lateness: int, dynamic: bool, seed: int) -> None:
    epochs = random_epochs(seed=seed, gaps=[0, 500, 1_500, 4_000, None] if dynamic else None)
    expected, expected_dropped = session_reference(epochs, gap_of(dynamic), DELAY, lateness, mode)
    out, dropped, _ = run_in_tester(lambda: session(mode, lateness, dynamic), epochs, DELAY)
    assert out == expected
    assert dropped == expected_dropped
    assert expected_dropped > 0
    restored, restored_dropped, _ = run_in_tester(lambda: session(mode, lateness, dynamic), epochs, DELAY,
                                                  snapshot_after=3)
    assert (restored, restored_dropped) == (out, dropped)


@pytest.mark.parametrize("mode", ["final", "update"])
def test_sessions_split_over_three_subtasks_equal_the_reference(tmp_path, mode: str) -> None:
    """Each subtask fires and cleans up only its own key groups' sessions."""
    epochs = random_epochs(seed=9, keys="abcdefgh", gaps=[500, 1_500, 4_000])
    expected, _ = session_reference(epochs, gap_of(True), DELAY, 3_000, mode)
    assert run_in_subtasks(tmp_path, session(mode, 3_000, dynamic=True), epochs, DELAY, parallelism=3) == expected


def test_a_late_row_that_bridges_two_fired_sessions_fires_the_merged_session_marked_late() -> None:
    tester = ProcessorTester(SessionWindow("s", ["k"], "ts", gap="1 s", allowed_lateness="10 s"))
    tester.process([{"k": "a", "ts": 0}, {"k": "a", "ts": 2_000}])
    fired = tester.advance_watermark(5_000)
    assert list(zip(fired["window_start"], fired["window_end"], fired["count"], fired["late"])) == \
        [(0, 1_000, 1, False), (2_000, 3_000, 1, False)]
    out = tester.process([{"k": "a", "ts": 1_000}])  # [1000, 2000) touches both
    assert list(zip(out["window_start"], out["window_end"], out["count"], out["late"])) == [(0, 3_000, 3, True)]


def test_a_session_stays_marked_late_after_a_late_row_bridged_into_it_until_it_fires() -> None:
    tester = ProcessorTester(SessionWindow("s", ["k"], "ts", gap="1 s", allowed_lateness="10 s"),
                             watermark=("ts", 2_000))
    tester.process([{"k": "a", "ts": 0}, {"k": "a", "ts": 2_000}, {"k": "b", "ts": 3_200}])
    # watermark 1200: [0, 1000) is behind it; [1000, 2000) joins it to [2000, 3000)
    assert tester.process([{"k": "a", "ts": 1_000}]).empty
    assert tester.process([{"k": "a", "ts": 2_900}]).empty  # on time, into the same session
    out = tester.finish()
    assert list(zip(out["k"], out["window_start"], out["window_end"], out["count"], out["late"])) == \
        [("a", 0, 3_900, 4, True), ("b", 3_200, 4_200, 1, False)]


def test_rows_whose_spans_touch_are_one_session_as_in_spark() -> None:
    tester = ProcessorTester(SessionWindow("s", ["k"], "ts", gap="1 s"))
    tester.process([{"k": "a", "ts": 0}, {"k": "a", "ts": 1_000}, {"k": "b", "ts": 0}, {"k": "b", "ts": 1_001}])
    out = tester.finish()
    assert sorted(zip(out["k"], out["window_start"], out["window_end"], out["count"])) == \
        [("a", 0, 2_000, 2), ("b", 0, 1_000, 1), ("b", 1_001, 2_001, 1)]


def test_sessions_of_one_epoch_that_spans_many_gaps_stay_apart() -> None:
    tester = ProcessorTester(SessionWindow("s", ["k"], "ts", gap="1 s"))
    tester.process([{"k": "a", "ts": t} for t in (0, 500, 5_000, 9_000, 9_999, 20_000)])
    out = tester.finish()
    assert list(zip(out["window_start"], out["window_end"], out["count"])) == \
        [(0, 1_500, 2), (5_000, 6_000, 1), (9_000, 10_999, 2), (20_000, 21_000, 1)]


@pytest.mark.parametrize("mode", ["final", "update"])
def test_no_session_state_is_left_once_the_watermark_passes_every_session(mode: str) -> None:
    tester = ProcessorTester(session(mode, 3_000, dynamic=False), watermark=("ts", DELAY))
    for rows in random_epochs(seed=5, epochs=4):
        tester.process(rows)
    assert stored_entries(tester) != []
    tester.advance_watermark(10**9)
    assert stored_entries(tester) == []


def test_a_session_window_needs_exactly_one_of_gap_and_gap_column() -> None:
    with pytest.raises(ConfigError, match="give either gap="):
        SessionWindow("s", ["k"], "ts", gap="1 s", gap_column="g")
    with pytest.raises(ConfigError, match="give either gap="):
        SessionWindow("s", ["k"], "ts")
