from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest
from join_support import (LEFT_SCHEMA, RIGHT_SCHEMA, arrivals, as_counters, combined, epochs_of, random_plan, run,
                          state_entries, table)

from sparkpoint import WindowJoin
from sparkpoint.errors import ConfigError
from sparkpoint.testing.harness import ProcessorTester

LEFT_COLS = ["id", "k2", "ts", "v"]
RIGHT_COLS = ["id", "k2", "ts", "w"]
SHARED = ("id", "k2")


def windows_of(t: int, size: int, slide: int) -> list[int]:
    """Window starts containing t, by brute force over the multiples of `slide`."""
    return [s for s in range((t - size) // slide * slide, t + 1, slide) if s <= t < s + size]


def reference(plan: list[tuple], size: int, slide: int) -> tuple[list[Counter], int]:
    """Every epoch's output and the dropped-row count, by nested loops: a row belongs to
    each of its windows not yet ended under the watermark it arrives with; a window's
    pairs come out in the first epoch whose watermark reaches its end (or the last)."""
    epochs = epochs_of(plan)
    placed: list[list[tuple[int, int, dict]]] = [[], []]  # per side: (epoch, window start, row)
    dropped = 0
    for side in (0, 1):
        for e, row in arrivals(plan, side):
            w = epochs[e]["watermark"]
            starts = [] if row["ts"] is None else \
                [s for s in windows_of(row["ts"], size, slide) if w is None or s + size > w]
            dropped += not starts
            placed[side] += [(e, s, row) for s in starts]
    out: list[list[tuple]] = [[] for _ in plan]
    for ea, sa, a in placed[0]:
        for eb, sb, b in placed[1]:
            if sa != sb or a["id"] is None or a["k2"] is None or (a["id"], a["k2"]) != (b["id"], b["k2"]):
                continue
            for e in range(max(ea, eb), len(plan)):
                w = epochs[e]["watermark"]
                if epochs[e]["final"] or (w is not None and w >= sa + size):
                    out[e].append((*combined(a, b, SHARED, LEFT_COLS, RIGHT_COLS), sa, sa + size))
                    break
    return as_counters(out), dropped


@pytest.mark.parametrize("size,slide", [(100, None), (150, 50), (60, 100)])
@pytest.mark.parametrize("seed", range(3))
def test_window_join_equals_a_brute_force_reference_epoch_by_epoch_across_a_restore(size: int, slide: int | None,
                                                                                     seed: int) -> None:
    rng = random.Random(f"{size}/{slide}/{seed}")
    plan = random_plan(rng, per_epoch=20)
    plan.append(("final",) if seed % 2 else ("watermark", 10**9))

    def make() -> WindowJoin:
        return WindowJoin("w", ["id", "k2"], ["id", "k2"], "ts", "ts", size, slide)

    expected, dropped = reference(plan, size, slide or size)
    assert sum(sum(c.values()) for c in expected) > 0, "the random plan joins nothing: a useless case"
    straight, tester = run(make, plan)
    assert as_counters(straight) == expected
    assert tester.late_rows_dropped == dropped
    restored, tester = run(make, plan, restore_at=len(plan) // 2)
    assert as_counters(restored) == expected
    assert tester.late_rows_dropped == dropped
    assert state_entries(tester) == 0  # fired windows leave nothing behind


def test_a_window_join_fires_once_at_the_window_end_with_its_bounds() -> None:
    op = WindowJoin("w", "id", "id", "ts", "ts", "1 s")
    op.resolve_input_schema(op.tag_rows(table([], LEFT_SCHEMA), table([], RIGHT_SCHEMA)).schema)
    assert op.output_schema.names == ["id", "k2", "ts", "v", "k2_right", "ts_right", "w", "window_start",
                                      "window_end"]
    tester = ProcessorTester(op)
    left = table([{"id": 1, "k2": "a", "ts": 100, "v": "x"}, {"id": 1, "k2": "a", "ts": 1_100, "v": "y"}], LEFT_SCHEMA)
    right = table([{"id": 1, "k2": "b", "ts": 999, "w": 1.0}, {"id": 2, "k2": "b", "ts": 500, "w": 2.0}],
                  RIGHT_SCHEMA)
    assert tester.process(op.tag_rows(left, right)).empty
    assert tester.advance_watermark(999).empty
    out = tester.advance_watermark(1_000)
    assert out[["v", "w", "window_start", "window_end"]].values.tolist() == [["x", 1.0, 0, 1_000]]
    assert tester.advance_watermark(5_000).empty
    assert state_entries(tester) == 0


def test_window_bounds_are_timestamps_when_the_left_time_is_a_timestamp() -> None:
    op = WindowJoin("w", "id", "id", "ts", "ts", "1 min")
    ts = pa.timestamp("us", tz="UTC")
    left = pa.table({"id": pa.array([1], pa.int64()), "ts": pa.array([90_000_000], ts)})
    right = pa.table({"id": pa.array([1], pa.int64()), "ts": pa.array([100_000], pa.int64())})
    op.resolve_input_schema(op.tag_rows(left, right).schema)
    assert op.output_schema.field("window_start").type == ts
    out = ProcessorTester(op).process(op.tag_rows(left, right.set_column(1, "ts", pa.array([61_000], pa.int64()))))
    assert out.empty  # not fired yet; the right row is in window [60 s, 120 s) like the left one


def test_window_join_arguments_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"WindowJoin 'w': size and slide must be > 0"):
        WindowJoin("w", "id", "id", "ts", "ts", 100, 0)
    with pytest.raises(ConfigError, match=r"WindowJoin 'w' size: 'soon' is not a duration"):
        WindowJoin("w", "id", "id", "ts", "ts", "soon")
