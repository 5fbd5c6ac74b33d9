from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from join_support import (LEFT_SCHEMA, RIGHT_SCHEMA, arrivals, as_counters, combined, epochs_of, normalized,
                          random_plan, run, state_entries, table)
from operator_support import MAX_PARALLELISM, ctx, run_partitioned, store_path, with_key_groups

from sparkpoint import IntervalJoin
from sparkpoint.errors import ConfigError
from sparkpoint.state.keys import META_PREFIX, key_group_range
from sparkpoint.state.store import SubtaskStateStore
from sparkpoint.testing.harness import ProcessorTester

LEFT_COLS = ["id", "k2", "ts", "v"]
RIGHT_COLS = ["id", "k2", "ts", "w"]
# Right rows whose key column has another name than the left one's.
RIGHT_RENAMED = pa.schema([("aid", pa.int64()), ("k2", pa.string()), ("ts", pa.int64()), ("w", pa.float64())])
KEYS = {
    "composite, same names": (["id", "k2"], ["id", "k2"], RIGHT_SCHEMA, ("id", "k2")),
    "other names": (["id"], ["aid"], RIGHT_RENAMED, ()),
}


def _key(row: dict, cols: list[str]) -> tuple | None:
    values = tuple(row[c] for c in cols)
    return None if any(v is None for v in values) else values


def reference(plan: list[tuple], lower: int, upper: int, how: str, left_on: list[str], right_on: list[str],
              shared: tuple[str, ...], right_cols: list[str]) -> tuple[list[Counter], int]:
    """Every epoch's output by nested loops over all rows, and how many rows are dropped.
    A row arriving under watermark W is late when its time is below W (or missing)."""
    epochs = epochs_of(plan)

    def on_time(e: int, row: dict) -> bool:
        w = epochs[e]["watermark"]
        return row["ts"] is not None and (w is None or row["ts"] >= w)

    lefts = [(e, r) for e, r in arrivals(plan, 0) if on_time(e, r)]
    rights = [(e, r) for e, r in arrivals(plan, 1) if on_time(e, r)]
    dropped = len(arrivals(plan, 0)) + len(arrivals(plan, 1)) - len(lefts) - len(rights)
    out: list[list[tuple]] = [[] for _ in plan]
    matched_left, matched_right = set(), set()
    for i, (ea, a) in enumerate(lefts):
        for j, (eb, b) in enumerate(rights):
            ka = _key(a, left_on)
            if ka is not None and ka == _key(b, right_on) and lower <= b["ts"] - a["ts"] <= upper:
                out[max(ea, eb)].append(combined(a, b, shared, LEFT_COLS, right_cols))
                matched_left.add(i)
                matched_right.add(j)

    def first_epoch_past(arrived: int, end: int, null_key: bool) -> int | None:
        if null_key:
            return arrived
        for e in range(arrived, len(plan)):
            w = epochs[e]["watermark"]
            if epochs[e]["final"] or (w is not None and w > end):
                return e
        return None  # the watermark never passed: not emitted yet

    if how == "left":
        for i, (ea, a) in enumerate(lefts):
            if i not in matched_left:
                e = first_epoch_past(ea, a["ts"] + upper, _key(a, left_on) is None)
                if e is not None:
                    out[e].append(combined(a, None, shared, LEFT_COLS, right_cols))
    if how == "right":
        for j, (eb, b) in enumerate(rights):
            if j not in matched_right:
                e = first_epoch_past(eb, b["ts"] - lower, _key(b, right_on) is None)
                if e is not None:
                    out[e].append(combined(None, b, shared, LEFT_COLS, right_cols))
    return as_counters(out), dropped


def _renamed(plan: list[tuple], right_schema: pa.Schema) -> list[tuple]:
    if right_schema is RIGHT_SCHEMA:
        return plan
    return [("rows", s[1], [{"aid": r["id"], **{k: v for k, v in r.items() if k != "id"}} for r in s[2]])
            if s[0] == "rows" else s for s in plan]


@pytest.mark.parametrize("keys", list(KEYS))
@pytest.mark.parametrize("how", ["inner", "left", "right"])
@pytest.mark.parametrize("seed", range(4))
def test_interval_join_equals_a_brute_force_reference_epoch_by_epoch_across_a_restore(keys: str, how: str,
                                                                                       seed: int) -> None:
    rng = random.Random(f"{keys}/{how}/{seed}")
    lower, upper = rng.choice([(-50, 80), (0, 0), (-120, -20), (10, 150)])
    left_on, right_on, right_schema, shared = KEYS[keys]
    plan = _renamed(random_plan(rng), right_schema)
    plan.append(("final",) if seed % 2 else ("watermark", 10**9))
    right_cols = list(right_schema.names)

    def make() -> IntervalJoin:
        return IntervalJoin("orders-payments", left_on, right_on, "ts", "ts", lower, upper, how)

    expected, dropped = reference(plan, lower, upper, how, left_on, right_on, shared, right_cols)
    assert sum(sum(c.values()) for c in expected) > 0, "the random plan joins nothing: a useless case"
    straight, tester = run(make, plan, right_schema=right_schema)
    assert as_counters(straight) == expected
    assert tester.late_rows_dropped == dropped
    restored, tester = run(make, plan, restore_at=len(plan) // 2, right_schema=right_schema)
    assert as_counters(restored) == expected
    assert tester.late_rows_dropped == dropped
    if plan[-1][0] == "watermark":  # the watermark passed every row: nothing may be left behind
        assert state_entries(tester) == 0


def _tester(how: str, lower: int = 0, upper: int = 100) -> tuple[IntervalJoin, ProcessorTester]:
    op = IntervalJoin("j", "id", "id", "ts", "ts", lower, upper, how)
    # What the driver does before the first epoch: learn the input's columns.
    op.resolve_input_schema(op.tag_rows(_left(), _right()).schema)
    return op, ProcessorTester(op)


def _left(*rows: tuple) -> pa.Table:
    return table([{"id": i, "k2": "a", "ts": t, "v": v} for i, t, v in rows], LEFT_SCHEMA)


def _right(*rows: tuple) -> pa.Table:
    return table([{"id": i, "k2": "a", "ts": t, "w": w} for i, t, w in rows], RIGHT_SCHEMA)


def test_an_unmatched_left_row_is_emitted_once_when_the_watermark_passes_the_end_of_its_interval() -> None:
    op, tester = _tester("left", 0, 100)
    assert tester.process(op.tag_rows(_left((1, 1_000, "a"), (2, 1_000, "b")), _right((2, 1_050, 5.0)))) \
        .to_dict("records") == [{"id": 2, "k2": "a", "ts": 1_000, "v": "b", "k2_right": "a", "ts_right": 1_050,
                                 "w": 5.0}]
    # Row 1 could still meet a right row at 1_100 (not late under a watermark of 1_100).
    assert tester.advance_watermark(1_100).empty
    out = tester.advance_watermark(1_101)
    assert out.to_dict("records")[0]["v"] == "a" and len(out) == 1
    assert out["ts_right"].isna().all() and out["w"].isna().all()
    assert tester.advance_watermark(5_000).empty  # once only; matched row 2 is never emitted unmatched
    assert tester.finish().empty
    assert state_entries(tester) == 0


def test_a_left_row_matched_by_a_later_right_row_is_not_emitted_unmatched() -> None:
    op, tester = _tester("left", 0, 100)
    assert tester.process(op.tag_rows(_left((1, 1_000, "a")), _right())).empty
    assert len(tester.process(op.tag_rows(_left(), _right((1, 1_100, 1.0), (1, 1_099, 2.0))))) == 2
    assert tester.advance_watermark(10_000).empty


def test_an_unmatched_right_row_waits_for_the_end_of_its_interval_then_the_end_of_input_emits_the_rest() -> None:
    op, tester = _tester("right", -50, 100)  # a right row at t meets left rows in [t - 100, t + 50]
    assert tester.process(op.tag_rows(_left(), _right((1, 1_000, 1.0), (2, 5_000, 2.0)))).empty
    assert tester.advance_watermark(1_050).empty
    out = tester.advance_watermark(1_051)
    assert out["w"].tolist() == [1.0] and out["v"].isna().all()
    assert tester.finish()["w"].tolist() == [2.0]  # the end of input flushes the outer rows still waiting
    assert state_entries(tester) == 0


def test_rows_below_the_watermark_are_dropped_and_counted() -> None:
    op, tester = _tester("left", 0, 100)
    tester.advance_watermark(1_000)
    out = tester.process(op.tag_rows(_left((1, 999, "late"), (1, None, "no time"), (1, 1_000, "on time")),
                                     _right((1, 998, 1.0), (1, 1_000, 2.0))))
    assert out["v"].tolist() == ["on time"] and out["w"].tolist() == [2.0]
    assert tester.late_rows_dropped == 3  # two late rows and one without event time
    assert tester.advance_watermark(2_000).empty  # the late left rows are not emitted as unmatched either


def test_an_outer_row_with_a_null_key_is_emitted_at_once_and_an_inner_one_never_matches() -> None:
    op, tester = _tester("left")
    out = tester.process(op.tag_rows(_left((None, 1_000, "nobody")), _right((None, 1_000, 1.0))))
    assert out["v"].tolist() == ["nobody"] and out["w"].isna().all()
    op, tester = _tester("inner")
    assert tester.process(op.tag_rows(_left((None, 1_000, "x")), _right((None, 1_000, 1.0)))).empty
    assert tester.finish().empty


def test_output_columns_left_then_right_with_a_suffix_on_a_clash() -> None:
    same = IntervalJoin("j", ["id", "k2"], ["id", "k2"], "ts", "ts", 0, 1)
    same.resolve_input_schema(same.tag_rows(table([], LEFT_SCHEMA), table([], RIGHT_SCHEMA)).schema)
    assert same.output_schema.names == ["id", "k2", "ts", "v", "ts_right", "w"]
    other = IntervalJoin("j", "id", "id", "ts", "ts", 0, 1, suffixes=("_o", "_p"))
    other.resolve_input_schema(other.tag_rows(table([], LEFT_SCHEMA), table([], RIGHT_SCHEMA)).schema)
    assert other.output_schema.names == ["id", "k2_o", "ts_o", "v", "k2_p", "ts_p", "w"]
    bad = IntervalJoin("j", "id", "id", "ts", "ts", 0, 1, suffixes=("", "_x"))
    left = pa.schema([*LEFT_SCHEMA, pa.field("w", pa.int64()), pa.field("w_x", pa.int64())])  # right w -> w_x
    with pytest.raises(ConfigError, match=r"IntervalJoin 'j'.*column\(s\) \['w_x'\] twice"):
        bad.resolve_input_schema(bad.tag_rows(table([], left), table([], RIGHT_SCHEMA)).schema)


def test_bad_arguments_fail_with_one_line_naming_the_join() -> None:
    with pytest.raises(ConfigError, match=r"IntervalJoin 'j': lower \(10 ms\) must not exceed upper \(-10 ms\)"):
        IntervalJoin("j", "id", "id", "ts", "ts", "10 ms", "-10 ms")
    with pytest.raises(ConfigError, match=r"how='full' is not supported"):
        IntervalJoin("j", "id", "id", "ts", "ts", 0, 1, how="full")
    with pytest.raises(ConfigError, match=r"left_on \['a', 'b'\] and right_on \['a'\] must name as many"):
        IntervalJoin("j", ["a", "b"], ["a"], "ts", "ts", 0, 1)
    op = IntervalJoin("j", "id", "id", "when", "ts", 0, 1)
    with pytest.raises(ConfigError, match=r"IntervalJoin 'j' left time: event-time column 'when' is not in the input"):
        op.resolve_input_schema(op.tag_rows(table([], LEFT_SCHEMA), table([], RIGHT_SCHEMA)).schema)


def test_lower_and_upper_take_signed_durations() -> None:
    op = IntervalJoin("j", "id", "id", "ts", "ts", "-15 min", "2 s")
    assert (op.lower, op.upper) == (-900_000, 2_000)
    assert op.requires_event_time and op.input_arity == 2


@pytest.mark.parametrize("how", ["left", "right"])
def test_at_parallelism_3_each_subtask_keeps_and_cleans_up_only_its_own_key_groups(tmp_path: Path, how: str) -> None:
    """Through the runtime's worker step, split by subtask as Spark splits it: the output
    is the reference's, and each subtask's store holds only its key-group range (the
    ranges a rescale hands to other subtasks)."""
    rng = random.Random(f"subtasks/{how}")
    lower, upper = -50, 80
    plan = random_plan(rng) + [("watermark", 10**9)]
    op = IntervalJoin("j", ["id", "k2"], ["id", "k2"], "ts", "ts", lower, upper, how)
    expected, dropped = reference(plan, lower, upper, how, ["id", "k2"], ["id", "k2"], ("id", "k2"), RIGHT_COLS)
    epochs = epochs_of(plan)
    got = []
    held = 0
    for e, step in enumerate(plan):
        left, right = (step[1], step[2]) if step[0] == "rows" else ([], [])
        rows = with_key_groups(op.tag_rows(table(left, LEFT_SCHEMA), table(right, RIGHT_SCHEMA)), op.key_columns)
        out = run_partitioned(tmp_path, op, rows, ctx(e, epochs[e]["watermark"]), 3)
        got.append(normalized(out.to_pandas()))
        for s in range(3):
            with SubtaskStateStore.open(store_path(tmp_path, op, s)) as store:
                groups = {int.from_bytes(k[:2], "big") for k, _ in store.scan_range(b"", META_PREFIX)}
                assert groups <= set(key_group_range(s, 3, MAX_PARALLELISM))
                held += len(groups)
    assert held > 0, "no subtask ever held state: the check above proves nothing"
    assert as_counters(got) == expected
    total_dropped = 0
    for s in range(3):
        with SubtaskStateStore.open(store_path(tmp_path, op, s)) as store:
            total_dropped += op.dropped_count(store)
            assert list(store.scan_range(b"", META_PREFIX)) == []
    assert total_dropped == dropped
