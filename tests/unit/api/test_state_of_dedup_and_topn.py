"""The state reader's decoding (what `sparkpoint.read_state` returns, here through the
test harness, which decodes a store exactly as the reader's Spark tasks do) for
`Deduplicate` and `TopN`: every held key with the time it is released, every row of
every key's current top with its rank, computed by hand from the input; a fresh
operator object (a restored tester) reads the same, and neither step has timers."""

from __future__ import annotations

import pandas as pd
import pytest

from sparkpoint import Deduplicate, TopN
from sparkpoint.errors import ConfigError
from sparkpoint.testing import ProcessorTester

WITHIN = 3_000


def _dedup() -> Deduplicate:
    return Deduplicate("first-send", ["id", "region"], "ts", within=WITHIN)


def _sends(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["id", "region", "ts", "n"]).astype({"id": "int64", "ts": "int64"})


def _held(state: pd.DataFrame) -> list[tuple]:
    return sorted(state.itertuples(index=False, name=None))


def test_a_dedup_reads_as_one_row_per_held_key_with_the_time_it_is_released():
    tester = ProcessorTester(_dedup(), watermark=("ts", 0))
    tester.process(_sends([(1, "eu", 1_000, 0), (1, "eu", 1_500, 1), (2, "eu", 2_000, 2), (1, "us", 500, 3)]))
    state = tester.state()
    assert list(state.columns) == ["id", "region", "release_ms"]
    # Each key's first row's event time + within; the copy of (1, eu) changed nothing.
    assert _held(state) == [(1, "eu", 4_000), (1, "us", 3_500), (2, "eu", 5_000)]

    # A fresh operator object (a restore, or a separate notebook) reads the same: the key
    # types come from the store.
    restored = ProcessorTester.from_snapshot(_dedup(), tester.snapshot(), watermark=("ts", 0))
    pd.testing.assert_frame_equal(restored.state(), state)

    # The watermark reaches 4 s: (1, us) and (1, eu) are released and leave the state.
    restored.advance_watermark(4_000)
    assert _held(restored.state()) == [(2, "eu", 5_000)]


def test_dedup_timers_are_refused_with_a_line_saying_where_the_release_time_is():
    tester = ProcessorTester(_dedup(), watermark=("ts", 0))
    tester.process(_sends([(1, "eu", 1_000, 0)]))
    with pytest.raises(ConfigError, match=r"Deduplicate 'first-send' keeps no timers.*release_ms.*read_state"):
        tester.timers()


def _top2() -> TopN:
    return TopN("top-bids", ["auction"], [("price", "desc")], 2, rank_column="rank_number")


def _bids(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["auction", "bidder", "price"]).astype("int64")


def _tops(state: pd.DataFrame) -> list[tuple]:
    return sorted(state.itertuples(index=False, name=None))


def test_a_topn_reads_as_one_row_per_held_row_with_its_rank():
    tester = ProcessorTester(_top2())
    tester.process(_bids([(7, 1, 10), (7, 2, 30), (7, 3, 20), (8, 1, 5)]))
    tester.process(_bids([(7, 4, 25), (8, 2, 5)]))  # 25 pushes 20 out; 8's tie is broken by bidder
    state = tester.state()
    assert list(state.columns) == ["auction", "rank_number", "bidder", "price"]
    assert _tops(state) == [(7, 1, 2, 30), (7, 2, 4, 25), (8, 1, 1, 5), (8, 2, 2, 5)]

    # A fresh operator object reads the same: the rows' columns come from the store.
    restored = ProcessorTester.from_snapshot(_top2(), tester.snapshot())
    pd.testing.assert_frame_equal(restored.state(), state)


def test_topn_timers_are_refused_with_a_line_saying_it_keeps_none():
    tester = ProcessorTester(_top2())
    tester.process(_bids([(7, 1, 10)]))
    with pytest.raises(ConfigError, match=r"TopN 'top-bids' keeps no timers.*read_state"):
        tester.timers()


def test_the_state_schemas_of_dedup_and_topn_travel_as_json_unchanged():
    """The reader ships each schema to its Spark tasks as JSON (never pickled)."""
    from sparkpoint.api.state_schema import describe
    from sparkpoint.state.descriptor import OperatorStateSchema

    top = _top2()
    ProcessorTester(top).process(_bids([(7, 1, 10)]))  # knows its row columns now
    for step in [_dedup(), Deduplicate("d", ["id"], "ts", within=WITHIN, key_schema="id BIGINT"), top]:
        desc = describe(step)
        again = OperatorStateSchema.from_json(desc.to_json())
        assert again == desc, step.name
    assert describe(top).output_schema() == OperatorStateSchema.from_json(describe(top).to_json()).output_schema()
