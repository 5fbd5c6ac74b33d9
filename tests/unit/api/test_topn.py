"""TopN against a reference that ranks all rows seen so far per key with pandas, epoch by
epoch, over random epochs with ties, in the tester, with a restore midway and over
several subtasks. The reference knows nothing of the operator's state layout."""

from __future__ import annotations

import random

import pandas as pd
import pyarrow as pa
import pytest
from operator_support import ctx, run_partitioned, with_key_groups

from sparkpoint import TopN
from sparkpoint.errors import ConfigError
from sparkpoint.testing import ProcessorTester

N = 3


def top3() -> TopN:
    return TopN("top", ["k"], [("price", "desc")], N, rank_column="rank_number")


def random_epochs(seed: int, epochs: int = 6, rows: int = 20) -> list[pd.DataFrame]:
    rnd = random.Random(seed)
    out, n = [], 0
    for _ in range(epochs):
        out.append(pd.DataFrame({"k": [rnd.choice("abcde") for _ in range(rows)],
                                 "price": [rnd.randrange(0, 15) for _ in range(rows)],  # many ties
                                 "n": list(range(n, n + rows))}))
        n += rows
    return out


def reference(epochs: list[pd.DataFrame]) -> list[list[tuple]]:
    """Per epoch, every key whose top 3 changed, whole: (k, price, n, rank)."""
    seen = pd.DataFrame(columns=["k", "price", "n"]).astype("int64")
    tops: dict[str, list[tuple]] = {}
    outputs = []
    for rows in epochs:
        seen = pd.concat([seen.astype({"k": object}), rows])
        emitted = []
        for k in sorted(rows["k"].unique()):
            ranked = seen[seen["k"] == k].sort_values(["price", "n"], ascending=[False, True]).head(N)
            top = [(k, int(r.price), int(r.n), i + 1) for i, r in enumerate(ranked.itertuples())]
            if top != tops.get(k):
                emitted += top
                tops[k] = top
        outputs.append(sorted(emitted))
    return outputs


def as_rows(df: pd.DataFrame) -> list[tuple]:
    return sorted(df[["k", "price", "n", "rank_number"]].itertuples(index=False, name=None))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_topn_equals_a_reference_ranking_everything_seen_and_a_restore_midway_changes_nothing(seed: int) -> None:
    epochs = random_epochs(seed)
    expected = reference(epochs)
    for snapshot_after in (None, 2):
        tester = ProcessorTester(top3())
        got = []
        for e, rows in enumerate(epochs):
            got.append(as_rows(tester.process(rows)))
            if e == snapshot_after:
                tester = ProcessorTester.from_snapshot(top3(), tester.snapshot().to_json())
        assert got == expected
        assert as_rows(tester.finish()) == []


@pytest.mark.parametrize("parallelism", [1, 3])
def test_topn_over_several_subtasks_gives_the_same_rows(tmp_path, parallelism: int) -> None:
    epochs = random_epochs(seed=9)
    step, got = top3(), []
    for e, rows in enumerate(epochs):
        table = with_key_groups(pa.Table.from_pandas(rows, preserve_index=False), ["k"])
        got.append(as_rows(run_partitioned(tmp_path, step, table, ctx(e, None), parallelism).to_pandas()))
    assert got == reference(epochs)


def test_a_key_whose_top_did_not_change_is_not_emitted() -> None:
    tester = ProcessorTester(top3())
    tester.process(pd.DataFrame({"k": ["a"] * 3, "price": [9, 8, 7], "n": [1, 2, 3]}))
    assert as_rows(tester.process(pd.DataFrame({"k": ["a"], "price": [1], "n": [4]}))) == []
    assert as_rows(tester.process(pd.DataFrame({"k": ["a"], "price": [8], "n": [0]}))) == sorted([
        ("a", 9, 1, 1), ("a", 8, 0, 2), ("a", 8, 2, 3)]), "ties in price: the other columns decide"


def test_order_by_is_parsed_from_the_ways_users_write_it() -> None:
    assert TopN("t", "k", "price desc", 1).order_by == [("price", "descending")]
    assert TopN("t", "k", ["a", ("b", "DESC"), "c asc"], 1).order_by == [
        ("a", "ascending"), ("b", "descending"), ("c", "ascending")]


@pytest.mark.parametrize("kwargs, message", [
    ({"order_by": "price sideways", "n": 1}, "order_by entries are"),
    ({"order_by": [], "n": 1}, "at least one column"),
    ({"order_by": "price", "n": 0}, "n must be a whole number >= 1"),
])
def test_bad_options_are_one_line(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        TopN("t", ["k"], **kwargs)


def test_an_input_with_the_rank_column_already_is_refused_at_start() -> None:
    step = TopN("t", ["k"], "price", 2)
    with pytest.raises(ConfigError, match="has a column named 'rank' already"):
        step.resolve_input_schema(pa.schema([("k", pa.string()), ("price", pa.int64()), ("rank", pa.int64())]))
