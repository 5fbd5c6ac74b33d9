"""SlidingWindow against a brute-force reference: each row's windows found by trying
every candidate window, over randomized out-of-order epochs, in the user test harness."""

from __future__ import annotations

import pandas as pd
import pytest
from windows_support import (AGGS, fixed_reference, random_epochs, run_in_subtasks, run_in_tester, sliding_windows_of,
                             stored_entries)

from sparkpoint import SlidingWindow
from sparkpoint.errors import ConfigError
from sparkpoint.testing import ProcessorTester

DELAY = 2_000


def sliding(mode: str, lateness: int, size: int = 10_000, slide: int = 5_000) -> SlidingWindow:
    return SlidingWindow("hop", ["k"], "ts", size=size, slide=slide, aggs=AGGS, value_column="v",
                         allowed_lateness=lateness, output_mode=mode)


@pytest.mark.parametrize("size,slide", [(10_000, 5_000), (10_000, 4_000), (6_000, 6_000)],
                         ids=["slide-divides-size", "pane-is-gcd", "tumbling"])
@pytest.mark.parametrize("lateness", [0, 3_000], ids=["no-lateness", "lateness"])
@pytest.mark.parametrize("mode", ["final", "update"])
def test_sliding_windows_equal_a_brute_force_reference_and_a_restore_midway_changes_nothing(
        mode: str, lateness: int, size: int, slide: int) -> None:
    epochs = random_epochs(seed=size + slide + lateness)
    expected, expected_dropped = fixed_reference(epochs, sliding_windows_of(size, slide), DELAY, lateness, mode)
    out, dropped, _ = run_in_tester(lambda: sliding(mode, lateness, size, slide), epochs, DELAY)
    assert out == expected
    assert dropped == expected_dropped
    assert expected_dropped > 0  # the input has rows beyond the lateness, and late rows within it:
    assert any(r[-1] for o in expected for r in o) == (lateness > 0)
    restored, restored_dropped, _ = run_in_tester(lambda: sliding(mode, lateness, size, slide), epochs, DELAY,
                                                  snapshot_after=3)
    assert (restored, restored_dropped) == (out, dropped)


@pytest.mark.parametrize("mode", ["final", "update"])
def test_sliding_windows_split_over_three_subtasks_equal_the_reference(tmp_path, mode: str) -> None:
    """Each subtask fires and cleans up only its own key groups' windows."""
    epochs = random_epochs(seed=4, keys="abcdefgh")
    expected, _ = fixed_reference(epochs, sliding_windows_of(10_000, 4_000), DELAY, 3_000, mode)
    assert run_in_subtasks(tmp_path, sliding(mode, 3_000, 10_000, 4_000), epochs, DELAY, parallelism=3) == expected


@pytest.mark.parametrize("mode", ["final", "update"])
def test_no_sliding_window_state_is_left_once_the_watermark_passes_every_window(mode: str) -> None:
    tester = ProcessorTester(sliding(mode, 3_000), watermark=("ts", DELAY))
    for rows in random_epochs(seed=7, epochs=4):
        tester.process(rows)
    assert stored_entries(tester) != []
    tester.advance_watermark(10**9)
    assert stored_entries(tester) == []


def test_a_window_step_gets_one_clear_line_for_a_slide_longer_than_the_size() -> None:
    with pytest.raises(ConfigError, match="need 0 < slide <= size"):
        SlidingWindow("hop", ["k"], "ts", size="1 min", slide="2 min")


def test_a_sliding_window_outputs_timestamps_for_a_timestamp_column() -> None:
    rows = pd.DataFrame({"k": ["a", "a"], "ts": pd.to_datetime([1_000, 7_000], unit="ms", utc=True)})
    tester = ProcessorTester(SlidingWindow("hop", ["k"], "ts", size="10 s", slide="5 s"))
    tester.process(rows)
    out = tester.finish()
    assert list(out["window_start"]) == [pd.Timestamp(ms, unit="ms", tz="UTC") for ms in (-5_000, 0, 5_000)]
    assert list(out["count"]) == [1, 2, 1]
