from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from operator_support import ctx, run_epoch, run_partitioned, store_path, with_key_groups

from sparkpoint.api import KeyedAggregate
from sparkpoint.errors import ConfigError
from sparkpoint.state.keys import META_PREFIX
from sparkpoint.state.store import SubtaskStateStore


def epoch_rows(rng: np.random.Generator, n: int) -> pd.DataFrame:
    values = rng.normal(size=n).round(3)
    values[rng.random(n) < 0.1] = np.nan
    return pd.DataFrame({"user": rng.choice(["ann", "bob", "cy", "dee", "eve", "fay"], n),
                         "region": rng.integers(0, 3, n), "amount": values})


def pre_aggregate_like_spark(df: pd.DataFrame) -> pa.Table:
    g = df.groupby(["user", "region"], sort=False)["amount"]
    agg = pd.DataFrame({"__count": g.size(), "__nvalues": g.count(), "__sum": g.sum(min_count=1),
                        "__min": g.min(), "__max": g.max()}).reset_index()
    return pa.Table.from_pandas(agg, preserve_index=False)


def latest_per_key(outputs: list[pa.Table]) -> pd.DataFrame:
    df = pd.concat([o.to_pandas() for o in outputs])
    return df.groupby(["user", "region"]).last().sort_index()


@pytest.mark.parametrize("parallelism, spark_pre_aggregated", [(1, True), (3, True), (2, False)])
def test_totals_across_epochs_equal_a_groupby_over_all_data(tmp_path: Path, parallelism: int,
                                                             spark_pre_aggregated: bool) -> None:
    op = KeyedAggregate("spend", ["user", "region"], "amount")
    rng = np.random.default_rng(7)
    seen, outputs = [], []
    for epoch in range(4):
        df = epoch_rows(rng, 200)
        seen.append(df)
        rows = pre_aggregate_like_spark(df) if spark_pre_aggregated else pa.Table.from_pandas(df)
        out = run_partitioned(tmp_path, op, with_key_groups(rows, ["user", "region"]), ctx(epoch), parallelism)
        touched = df[["user", "region"]].drop_duplicates()
        assert out.num_rows == len(touched)  # update mode: exactly the keys touched this epoch
        outputs.append(out)
    everything = pd.concat(seen).groupby(["user", "region"])["amount"]
    expected = pd.DataFrame({"count": everything.size(), "sum": everything.sum(min_count=1),
                             "min": everything.min(), "max": everything.max()}).sort_index()
    got = latest_per_key(outputs)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, atol=1e-9)


def test_all_null_values_give_a_count_and_null_totals(tmp_path: Path) -> None:
    op = KeyedAggregate("spend", ["user"], "amount", aggs=("count", "sum", "max"))
    rows = with_key_groups(pa.table({"user": ["ann", "ann"], "amount": pa.array([None, None], pa.float64())}),
                           ["user"])
    out = run_epoch(tmp_path, op, rows, ctx(0))
    assert out.to_pylist() == [{"user": "ann", "count": 2, "sum": None, "max": None}]
    assert out.schema == op.output_schema


def test_integer_values_stay_integers(tmp_path: Path) -> None:
    op = KeyedAggregate("clicks", ["page"], "n", value_type="bigint", key_schema="page BIGINT")
    rows = with_key_groups(pa.table({"page": [1, 1, 2], "n": [2**53, 1, 5]}), ["page"])
    out = run_epoch(tmp_path, op, rows, ctx(0))
    assert out.schema == op.output_schema
    by_page = {r["page"]: r for r in out.to_pylist()}
    assert by_page[1] == {"page": 1, "count": 2, "sum": 2**53 + 1, "min": 1, "max": 2**53}


def test_every_state_key_starts_with_its_rows_key_group(tmp_path: Path) -> None:
    op = KeyedAggregate("spend", ["user"], "amount")
    rows = with_key_groups(pa.table({"user": [f"u{i}" for i in range(50)], "amount": [1.0] * 50}), ["user"])
    run_epoch(tmp_path, op, rows, ctx(0))
    with SubtaskStateStore.open(store_path(tmp_path, op)) as store:
        keys = [k for k, _ in store.scan_range(b"", META_PREFIX)]
    assert len(keys) == 50
    assert sorted(int.from_bytes(k[:2], "big") for k in keys) == sorted(rows.column("__kg").to_pylist())


def test_a_failure_inside_apply_leaves_state_at_the_previous_epoch(tmp_path: Path, monkeypatch) -> None:
    op = KeyedAggregate("spend", ["user"], "amount")
    first = with_key_groups(pa.table({"user": ["ann", "bob"], "amount": [1.0, 2.0]}), ["user"])
    run_epoch(tmp_path, op, first, ctx(0))
    second = with_key_groups(pa.table({"user": ["ann", "cy"], "amount": [10.0, 20.0]}), ["user"])

    def explode(*_args, **_kwargs):
        raise RuntimeError("executor lost mid-apply")

    with SubtaskStateStore.open(store_path(tmp_path, op)) as store:
        monkeypatch.setattr(store, "put_many", explode)
        with pytest.raises(RuntimeError):
            op.apply(store, second, ctx(1))
    monkeypatch.undo()
    # Spark retries the task: it applies epoch 1 from the committed epoch 0 exactly once.
    out = run_epoch(tmp_path, op, second, ctx(1))
    assert sorted((r["user"], r["sum"]) for r in out.to_pylist()) == [("ann", 11.0), ("cy", 20.0)]
    assert run_epoch(tmp_path, op, second, ctx(1)).equals(out)  # a second retry returns the same rows
    with SubtaskStateStore.open(store_path(tmp_path, op)) as store:
        assert store.epoch() == 1


def test_output_schema_needs_key_types_until_they_are_known() -> None:
    op = KeyedAggregate("spend", ["user"], "amount")
    with pytest.raises(ConfigError, match="key_schema"):
        _ = op.output_schema
    op.resolve_input_schema(pa.schema([("user", pa.string()), ("amount", pa.float64())]))
    assert op.output_schema.names == ["user", "count", "sum", "min", "max"]
    with pytest.raises(ConfigError, match="subset"):
        KeyedAggregate("x", ["k"], "v", aggs=("avg",))


def test_aggs_added_after_the_state_began_are_refused_not_silently_partial(tmp_path: Path) -> None:
    rows = with_key_groups(pa.table({"page": [1, 1, 2], "n": [4, 1, 5]}), ["page"])
    first = KeyedAggregate("clicks", ["page"], "n", aggs=("count", "sum"), value_type="bigint", key_schema="page BIGINT")
    run_epoch(tmp_path, first, rows, ctx(0))
    more = KeyedAggregate("clicks", ["page"], "n", aggs=("count", "max"), value_type="bigint", key_schema="page BIGINT")
    with pytest.raises(ConfigError, match=r"aggs \['max'\] were added after its state began"):
        run_epoch(tmp_path, more, rows, ctx(1))
    fewer = KeyedAggregate("clicks", ["page"], "n", aggs=("sum",), value_type="bigint", key_schema="page BIGINT")
    by_page = {r["page"]: r["sum"] for r in run_epoch(tmp_path, fewer, rows, ctx(1)).to_pylist()}
    assert by_page == {1: 10, 2: 10}
