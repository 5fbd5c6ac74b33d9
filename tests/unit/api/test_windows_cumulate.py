"""CumulateWindow against a brute-force reference: each row's windows found by trying
every step boundary of its period, over randomized out-of-order epochs, in the tester."""

from __future__ import annotations

import pyarrow as pa
import pytest
from windows_support import AGGS, cumulate_windows_of, fixed_reference, random_epochs, run_in_tester, stored_entries

from sparkpoint import CumulateWindow
from sparkpoint.errors import ConfigError
from sparkpoint.testing import ProcessorTester

DELAY = 2_000


def cumulate(mode: str, lateness: int, step: int = 3_000, size: int = 12_000,
             value_type: str = "double") -> CumulateWindow:
    return CumulateWindow("cumulate", ["k"], "ts", step=step, size=size, aggs=AGGS, value_column="v",
                          allowed_lateness=lateness, output_mode=mode, value_type=value_type)


@pytest.mark.parametrize("step,size", [(3_000, 12_000), (5_000, 5_000)], ids=["four-steps", "one-step"])
@pytest.mark.parametrize("lateness", [0, 3_000], ids=["no-lateness", "lateness"])
@pytest.mark.parametrize("mode", ["final", "update"])
def test_cumulate_windows_equal_a_brute_force_reference_and_a_restore_midway_changes_nothing(
        mode: str, lateness: int, step: int, size: int) -> None:
    epochs = random_epochs(seed=step + size + lateness)
    expected, expected_dropped = fixed_reference(epochs, cumulate_windows_of(step, size), DELAY, lateness, mode)
    out, dropped, _ = run_in_tester(lambda: cumulate(mode, lateness, step, size), epochs, DELAY)
    assert out == expected
    assert dropped == expected_dropped
    assert expected_dropped > 0
    assert any(r[-1] for o in expected for r in o) == (lateness > 0)
    restored, restored_dropped, _ = run_in_tester(lambda: cumulate(mode, lateness, step, size), epochs, DELAY,
                                                  snapshot_after=4)
    assert (restored, restored_dropped) == (out, dropped)


@pytest.mark.parametrize("mode", ["final", "update"])
def test_bigint_aggregates_equal_the_reference(mode: str) -> None:
    epochs = random_epochs(seed=17, epochs=5)
    expected, _ = fixed_reference(epochs, cumulate_windows_of(3_000, 12_000), DELAY, 3_000, mode)
    out, _, tester = run_in_tester(lambda: cumulate(mode, 3_000, value_type="bigint"), epochs, DELAY)
    assert out == expected
    schema = tester.step.output_schema
    assert [schema.field(a).type for a in ("sum", "min", "max", "avg")] == [pa.int64()] * 3 + [pa.float64()]


def test_a_cumulate_window_runs_from_its_period_start_to_each_step() -> None:
    tester = ProcessorTester(CumulateWindow("c", ["k"], "ts", step="1 s", size="3 s"))
    tester.process([{"k": "a", "ts": 500}, {"k": "a", "ts": 1_500}, {"k": "a", "ts": 3_100}])
    out = tester.finish()
    assert list(zip(out["window_start"], out["window_end"], out["count"])) == \
        [(0, 1_000, 1), (0, 2_000, 2), (0, 3_000, 2), (3_000, 4_000, 1), (3_000, 5_000, 1), (3_000, 6_000, 1)]


@pytest.mark.parametrize("mode", ["final", "update"])
def test_no_cumulate_window_state_is_left_once_the_watermark_passes_every_window(mode: str) -> None:
    tester = ProcessorTester(cumulate(mode, 3_000), watermark=("ts", DELAY))
    for rows in random_epochs(seed=3, epochs=4):
        tester.process(rows)
    assert stored_entries(tester) != []
    tester.advance_watermark(10**9)
    assert stored_entries(tester) == []


def test_a_cumulate_size_that_is_not_a_multiple_of_the_step_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="the size must be a positive multiple of the step"):
        CumulateWindow("c", ["k"], "ts", step="2 min", size="5 min")
