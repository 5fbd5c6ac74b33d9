from __future__ import annotations

import random
from collections import Counter

import pytest
from join_support import (LEFT_SCHEMA, RIGHT_SCHEMA, arrivals, as_counters, combined, epochs_of, random_plan, run,
                          state_entries, table)

from sparkpoint import StreamJoin
from sparkpoint.errors import ConfigError
from sparkpoint.testing.harness import ProcessorTester

LEFT_COLS = ["id", "k2", "ts", "v"]
RIGHT_COLS = ["id", "k2", "ts", "w"]
SHARED = ("id", "k2")


def reference(plan: list[tuple], ttl: int | None) -> list[Counter]:
    """Every pair of rows with equal non-null keys, out in the epoch of the later row,
    unless the earlier row's time to live (from the processing time it arrived at) ran
    out by the processing time the later one arrived at."""
    epochs = epochs_of(plan)
    out: list[list[tuple]] = [[] for _ in plan]
    for ea, a in arrivals(plan, 0):
        for eb, b in arrivals(plan, 1):
            if a["id"] is None or a["k2"] is None or (a["id"], a["k2"]) != (b["id"], b["k2"]):
                continue
            first, second = sorted((ea, eb))
            if ttl is not None and epochs[first]["time"] + ttl <= epochs[second]["time"]:
                continue
            out[second].append(combined(a, b, SHARED, LEFT_COLS, RIGHT_COLS))
    return as_counters(out)


@pytest.mark.parametrize("ttl", [None, 150, 400])
@pytest.mark.parametrize("seed", range(3))
def test_stream_join_equals_a_brute_force_reference_epoch_by_epoch_across_a_restore(ttl: int | None,
                                                                                     seed: int) -> None:
    rng = random.Random(f"{ttl}/{seed}")
    plan = random_plan(rng, per_epoch=8, with_time=True)

    def make() -> StreamJoin:
        return StreamJoin("s", ["id", "k2"], ["id", "k2"], ttl=ttl)

    expected = reference(plan, ttl)
    assert sum(sum(c.values()) for c in expected) > 0, "the random plan joins nothing: a useless case"
    straight, _ = run(make, plan)
    assert as_counters(straight) == expected
    restored, tester = run(make, plan, restore_at=len(plan) // 2)
    assert as_counters(restored) == expected
    assert tester.late_rows_dropped == 0  # without event time nothing is late


def test_rows_are_forgotten_once_their_time_to_live_runs_out() -> None:
    op = StreamJoin("s", "id", "id", ttl="1 s")
    tester = ProcessorTester(op)
    left = table([{"id": 1, "k2": "a", "ts": None, "v": "x"}], LEFT_SCHEMA)
    right = table([{"id": 1, "k2": "b", "ts": None, "w": 1.0}], RIGHT_SCHEMA)
    assert tester.process(op.tag_rows(left, right.slice(0, 0))).empty
    tester.set_processing_time(999)
    assert len(tester.process(op.tag_rows(left.slice(0, 0), right))) == 1  # 999 ms after: still there
    assert state_entries(tester) > 0
    tester.set_processing_time(2_000)  # both rows' time to live ran out
    assert state_entries(tester) == 0
    assert tester.process(op.tag_rows(left, right.slice(0, 0))).empty


def test_without_ttl_every_row_is_kept_and_the_join_needs_no_event_time() -> None:
    op = StreamJoin("s", "id", "id")
    assert not op.requires_event_time and op.input_arity == 2
    tester = ProcessorTester(op)
    left = table([{"id": 1, "k2": "a", "ts": 5, "v": "x"}], LEFT_SCHEMA)
    right = table([{"id": 1, "k2": "b", "ts": 7, "w": 1.0}], RIGHT_SCHEMA)
    tester.process(op.tag_rows(left, right.slice(0, 0)))
    tester.set_processing_time(10**12)
    out = tester.process(op.tag_rows(left.slice(0, 0), right))
    assert out[["ts", "ts_right"]].values.tolist() == [[5, 7]]  # both time columns pass through


def test_stream_join_arguments_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"StreamJoin 's': how='left' is not supported; use one of \['inner'\]"):
        StreamJoin("s", "id", "id", how="left")
    with pytest.raises(ConfigError, match=r"StreamJoin 's': ttl must be > 0"):
        StreamJoin("s", "id", "id", ttl=0)
