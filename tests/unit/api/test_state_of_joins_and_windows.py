"""The state reader's decoding (what `sparkpoint.read_state` / `read_timers` return, here
through the test harness, which decodes a store exactly as the reader's Spark tasks
do) for join steps and for the sliding, session and cumulate windows: every buffered
row or held window, with the values the input put there, computed by hand from the
input."""

from __future__ import annotations

import pandas as pd
import pytest

from sparkpoint import CumulateWindow, IntervalJoin, SessionWindow, SlidingWindow, StreamJoin, WindowJoin
from sparkpoint.errors import ConfigError
from sparkpoint.testing.harness import ProcessorTester

MIN = 60_000


def _orders(ids, ts):
    return pd.DataFrame({"order_id": ids, "customer": [f"c{i}" for i in ids], "ts": ts})


def _payments(ids, ts):
    return pd.DataFrame({"order_id": ids, "paid_at": ts, "amount": [float(i) * 1.5 for i in ids]})


def _rows(state: pd.DataFrame, side: str) -> list[tuple]:
    mine = state[state.side == side]
    return sorted((r.order_id, r.time_ms, None if pd.isna(r.matched) else bool(r.matched), getattr(r, side)["order_id"])
                  for r in mine.itertuples())


def test_an_interval_join_reads_as_its_buffered_rows_with_their_time_and_whether_they_matched():
    join = IntervalJoin("paid", "order_id", "order_id", "ts", "paid_at", 0, "15 min", how="left")
    tester = ProcessorTester(join)
    tester.process(join.tag_rows(_orders([1, 2, 3], [0, 0, MIN]), _payments([1], [MIN])))
    state = tester.state()
    assert list(state.columns) == ["order_id", "side", "time_ms", "matched", "left", "right"]
    assert _rows(state, "left") == [(1, 0, True, 1), (2, 0, False, 2), (3, MIN, False, 3)]
    assert _rows(state, "right") == [(1, MIN, None, 1)]  # not an outer side: never emitted unmatched
    left = state[state.side == "left"].sort_values("order_id")
    assert [r["customer"] for r in left.left] == ["c1", "c2", "c3"]
    assert left.right.isna().all() and state[state.side == "right"].left.isna().all()
    assert state[state.side == "right"].right.iloc[0] == {"order_id": 1, "paid_at": MIN, "amount": 1.5}

    # A restored tester (a fresh operator object that has seen no rows) reads the same:
    # the rows' columns come from the store, not from the operator.
    fresh = IntervalJoin("paid", "order_id", "order_id", "ts", "paid_at", 0, "15 min", how="left")
    restored = ProcessorTester.from_snapshot(fresh, tester.snapshot())
    pd.testing.assert_frame_equal(restored.state(), state)

    # The watermark passes the 15 minutes of orders 1 and 2, and the time of the payment:
    # they leave the state (order 2 comes out unmatched); order 3 is still held.
    unpaid = restored.advance_watermark(15 * MIN + 1)
    assert unpaid.order_id.tolist() == [2]
    after = restored.state()
    assert _rows(after, "left") == [(3, MIN, False, 3)]
    assert _rows(after, "right") == []


def test_interval_join_timers_are_refused_with_a_line_saying_where_the_clean_up_time_is():
    join = IntervalJoin("paid", "order_id", "order_id", "ts", "paid_at", 0, "15 min")
    tester = ProcessorTester(join)
    tester.process(join.tag_rows(_orders([1], [0]), _payments([1], [MIN])))
    with pytest.raises(ConfigError, match=r"join 'paid' keeps no timers.*read_state"):
        tester.timers()


def test_a_window_join_reads_as_each_row_in_each_window_it_waits_in():
    join = WindowJoin("same-minute", "order_id", "order_id", "ts", "paid_at", size="1 min", slide="30 s")
    tester = ProcessorTester(join)
    tester.process(join.tag_rows(_orders([1], [40_000]), _payments([2], [70_000])))
    state = tester.state()
    assert list(state.columns) == ["order_id", "side", "window_start", "window_end", "left", "right"]
    got = sorted(zip(state.order_id, state.side, state.window_start, state.window_end))
    assert got == [(1, "left", 0, 60_000), (1, "left", 30_000, 90_000),
                   (2, "right", 30_000, 90_000), (2, "right", 60_000, 120_000)]


def test_a_stream_join_reads_as_every_row_it_keeps():
    join = StreamJoin("shipped", "order_id", "order_id")
    tester = ProcessorTester(join)
    tester.process(join.tag_rows(_orders([1, 2], [0, 0]), _payments([2, 2], [5, 6])))
    state = tester.state()
    assert list(state.columns) == ["order_id", "side", "left", "right"]
    assert sorted(zip(state.order_id, state.side)) == [(1, "left"), (2, "left"), (2, "right"), (2, "right")]
    assert sorted(r["paid_at"] for r in state[state.side == "right"].right) == [5, 6]


# -- windows ------------------------------------------------------------------------------
def _events(rows):
    return pd.DataFrame(rows, columns=["k", "ts", "v"]).astype({"ts": "int64", "v": "float64"})


WINDOW_COLUMNS = ["k", "window_start", "window_end", "count", "sum", "avg", "fired", "late"]


def _windows(df: pd.DataFrame) -> list[tuple]:
    return sorted(tuple(r) for r in df[WINDOW_COLUMNS].itertuples(index=False, name=None))


def test_a_sliding_window_reads_as_one_row_per_key_and_window_held_and_its_timers():
    step = SlidingWindow("hop", ["k"], "ts", size="10 s", slide="5 s", aggs=("count", "sum", "avg"),
                         value_column="v", allowed_lateness="5 s")
    tester = ProcessorTester(step, watermark=("ts", 0))
    tester.process(_events([("a", 1_000, 1.0), ("a", 6_000, 2.0), ("b", 12_000, 4.0)]))
    # Under watermark 12 s: a's [-5, 5) fired and was dropped (its lateness ended at 10 s);
    # a's [0, 10) fired and is kept until 15 s for late rows.
    tester.process(_events([("b", 13_000, 8.0)]))
    assert _windows(tester.state()) == [
        ("a", 0, 10_000, 2, 3.0, 1.5, True, False),
        ("a", 5_000, 15_000, 1, 2.0, 2.0, False, False),
        ("b", 5_000, 15_000, 2, 12.0, 6.0, False, False),
        ("b", 10_000, 20_000, 2, 12.0, 6.0, False, False),
    ]
    timers = tester.timers()
    assert list(timers.columns) == ["k", "window_start", "window_end", "timer", "expiry_ms"]
    got = sorted(zip(timers.k, timers.window_start, timers.timer, timers.expiry_ms))
    assert got == [("a", 0, "cleanup", 15_000), ("a", 5_000, "fire", 15_000),
                   ("b", 5_000, "fire", 15_000), ("b", 10_000, "fire", 20_000)]


def test_a_cumulate_window_reads_as_its_running_windows():
    step = CumulateWindow("running", ["k"], "ts", step="10 s", size="30 s", aggs=("count", "sum", "avg"),
                          value_column="v")
    tester = ProcessorTester(step)
    tester.process(_events([("a", 1_000, 1.0), ("a", 15_000, 3.0)]))
    assert _windows(tester.state()) == [
        ("a", 0, 10_000, 1, 1.0, 1.0, False, False),
        ("a", 0, 20_000, 2, 4.0, 2.0, False, False),
        ("a", 0, 30_000, 2, 4.0, 2.0, False, False),
    ]


def test_a_session_window_reads_as_its_open_sessions():
    step = SessionWindow("visits", ["k"], "ts", gap="5 s", aggs=("count", "sum", "avg"), value_column="v")
    tester = ProcessorTester(step)
    tester.process(_events([("a", 0, 1.0), ("a", 3_000, 2.0), ("a", 20_000, 4.0), ("b", 1_000, 8.0)]))
    tester.process(_events([("a", 6_000, 3.0)]))  # extends a's first session
    assert _windows(tester.state()) == [
        ("a", 0, 11_000, 3, 6.0, 2.0, False, False),
        ("a", 20_000, 25_000, 1, 4.0, 4.0, False, False),
        ("b", 1_000, 6_000, 1, 8.0, 8.0, False, False),
    ]
    timers = tester.timers()
    assert sorted(zip(timers.k, timers.window_start, timers.window_end, timers.timer, timers.expiry_ms)) == [
        ("a", 0, 11_000, "fire", 11_000), ("a", 20_000, 25_000, "fire", 25_000), ("b", 1_000, 6_000, "fire", 6_000)]


def test_the_state_schemas_of_joins_and_windows_travel_as_json_unchanged():
    """The reader ships each schema to its Spark tasks as JSON (never pickled)."""
    from sparkpoint.api.state_schema import describe
    from sparkpoint.state.descriptor import OperatorStateSchema

    join = IntervalJoin("paid", "order_id", "order_id", "ts", "paid_at", 0, "15 min", how="left")
    tester = ProcessorTester(join)
    tester.process(join.tag_rows(_orders([1], [0]), _payments([1], [MIN])))
    steps = [join, WindowJoin("w", "order_id", "order_id", "ts", "paid_at", size="1 min"),
             SlidingWindow("hop", ["k"], "ts", size="10 s", slide="5 s", aggs=("count", "avg"), value_column="v",
                           output_mode="update", key_schema="k STRING"),
             SessionWindow("visits", ["k"], "ts", gap="5 s", key_schema="k STRING"),
             CumulateWindow("running", ["k"], "ts", step="10 s", size="30 s", key_schema="k STRING")]
    for step in steps:
        desc = describe(step)
        again = OperatorStateSchema.from_json(desc.to_json())
        assert again == desc, step.name
    assert describe(join).output_schema() == OperatorStateSchema.from_json(describe(join).to_json()).output_schema()
