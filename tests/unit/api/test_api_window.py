from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from operator_support import ctx, run_epoch, run_partitioned, store_path, with_key_groups

from sparkpoint.api import TumblingWindow
from sparkpoint.errors import ConfigError
from sparkpoint.state.keys import META_PREFIX
from sparkpoint.state.store import SubtaskStateStore


def events(*pairs: tuple[str, int]) -> pa.Table:
    return with_key_groups(pa.table({"key": [k for k, _ in pairs], "ts": pa.array([t for _, t in pairs], pa.int64())}),
                           ["key"])


def fired(out: pa.Table) -> list[tuple]:
    return [(r["key"], r["window_start"], r["window_end"], r["count"]) for r in out.to_pylist()]


def dropped(tmp_path: Path, op: TumblingWindow) -> int:
    with SubtaskStateStore.open(store_path(tmp_path, op)) as store:
        return op.dropped_count(store)


def test_a_window_fires_exactly_once_when_the_watermark_passes_its_end(tmp_path: Path) -> None:
    op = TumblingWindow("w", ["key"], "ts", size="10 s")
    assert fired(run_epoch(tmp_path, op, events(("a", 1000), ("a", 9999), ("b", 5000)), ctx(0, 9_998))) == []
    assert fired(run_epoch(tmp_path, op, events(("a", 10_000)), ctx(1, 9_999))) == []
    out = run_epoch(tmp_path, op, events(("a", 12_000)), ctx(2, 10_000))
    assert fired(out) == [("a", 0, 10_000, 2), ("b", 0, 10_000, 1)]
    assert out.schema == op.output_schema
    assert fired(run_epoch(tmp_path, op, pa.table({}), ctx(3, 15_000))) == []
    assert fired(run_epoch(tmp_path, op, events(), ctx(4, 20_000))) == [("a", 10_000, 20_000, 2)]


def test_late_data_within_lateness_refires_and_beyond_lateness_is_dropped(tmp_path: Path) -> None:
    op = TumblingWindow("w", ["key"], "ts", size_ms=10_000, allowed_lateness_ms=5_000)
    assert fired(run_epoch(tmp_path, op, events(("a", 1_000)), ctx(0, 10_000))) == [("a", 0, 10_000, 1)]
    # late but within lateness: the window fires again with the updated count
    assert fired(run_epoch(tmp_path, op, events(("a", 2_000), ("a", 3_000)), ctx(1, 12_000))) == \
        [("a", 0, 10_000, 3)]
    assert fired(run_epoch(tmp_path, op, events(), ctx(2, 14_999))) == []  # no re-fire without new data
    # a window first seen late (within lateness) fires at once
    assert fired(run_epoch(tmp_path, op, events(("b", 9_000)), ctx(3, 14_999))) == [("b", 0, 10_000, 1)]
    # end + lateness <= watermark: state is gone and late rows are dropped and counted
    assert fired(run_epoch(tmp_path, op, events(("a", 4_000), ("b", 1)), ctx(4, 15_000))) == []
    assert dropped(tmp_path, op) == 2
    with SubtaskStateStore.open(store_path(tmp_path, op)) as store:
        assert [k for k, _ in store.scan_range(b"", b"\xff\xff")] == []  # no state left behind


def test_late_rows_are_dropped_without_lateness(tmp_path: Path) -> None:
    op = TumblingWindow("w", ["key"], "ts", size_ms=10_000)
    assert fired(run_epoch(tmp_path, op, events(("a", 1)), ctx(0, 5_000))) == []
    # the watermark reached the window's end: the row at 2 arrives too late to count
    assert fired(run_epoch(tmp_path, op, events(("a", 2), ("a", 10_001)), ctx(1, 10_000))) == [("a", 0, 10_000, 1)]
    assert dropped(tmp_path, op) == 1


def test_final_fires_every_pending_window(tmp_path: Path) -> None:
    op = TumblingWindow("w", ["key"], "ts", size_ms=1_000, aggs=("count", "sum"), value_column="v")
    rows = with_key_groups(pa.table({"key": ["a", "a", "b"], "ts": [100, 5_500, 9_000], "v": [1.5, 2.0, 4.0]}),
                           ["key"])
    assert run_epoch(tmp_path, op, rows, ctx(0, None)).num_rows == 0
    out = run_epoch(tmp_path, op, pa.table({}), ctx(1, None, final=True))
    assert [(r["key"], r["window_start"], r["count"], r["sum"]) for r in out.to_pylist()] == \
        [("a", 0, 1, 1.5), ("a", 5_000, 1, 2.0), ("b", 9_000, 1, 4.0)]


@pytest.mark.parametrize("names", [list("abcd"), [-7, 0, 12, 1 << 40], [-1.5, 0.0, 2.25]],
                         ids=["string-key", "integer-key", "float-key"])
def test_results_equal_a_pandas_reference_over_many_epochs_and_subtasks(tmp_path: Path, names: list) -> None:
    rng = np.random.default_rng(3)
    op = TumblingWindow("w", ["key", "shard"], "ts", size_ms=1_000, aggs=("count", "sum"), value_column="v",
                        value_type="bigint")
    delay, clock, seen, outputs = 800, 0, [], []
    for epoch in range(12):
        n = 300
        ts = clock + rng.integers(-delay // 2, 500, n)  # out of order, but never behind the watermark
        df = pd.DataFrame({"key": rng.choice(names, n), "shard": rng.integers(0, 2, n), "ts": ts,
                           "v": rng.integers(0, 100, n)})
        seen.append(df)
        clock += 500
        watermark = int(pd.concat(seen)["ts"].max()) - delay
        # Spark-style pre-aggregation per (key, window_start)
        df["window_start"] = df["ts"] - df["ts"] % 1_000
        partial = df.groupby(["key", "shard", "window_start"]).agg(__count=("v", "size"), __sum=("v", "sum"))
        rows = with_key_groups(pa.Table.from_pandas(partial.reset_index(), preserve_index=False), ["key", "shard"])
        outputs.append(run_partitioned(tmp_path, op, rows, ctx(epoch, watermark), 2))
    outputs.append(run_partitioned(tmp_path, op, with_key_groups(rows.slice(0, 0).drop(["__kg"]), ["key", "shard"]),
                                   ctx(12, None, final=True), 2))
    got = pd.concat([o.to_pandas() for o in outputs])
    assert not got.duplicated(["key", "shard", "window_start"]).any()  # each window fired once
    everything = pd.concat(seen)
    everything["window_start"] = everything["ts"] - everything["ts"] % 1_000
    expected = everything.groupby(["key", "shard", "window_start"]).agg(count=("v", "size"), sum=("v", "sum"))
    got = got.set_index(["key", "shard", "window_start"]).sort_index()[["count", "sum"]]
    pd.testing.assert_frame_equal(got, expected.sort_index(), check_dtype=False)


def test_raw_timestamp_rows_are_windowed_like_pre_aggregated_ones(tmp_path: Path) -> None:
    op = TumblingWindow("w", ["key"], "at", size="1 min")
    at = pa.array([0, 59_999, 60_000, None], pa.timestamp("ms", tz="UTC"))
    rows = with_key_groups(pa.table({"key": ["a", "a", "a", "a"], "at": at}), ["key"])
    out = run_epoch(tmp_path, op, rows, ctx(0, None, final=True))
    # Timestamps in, timestamps out (docs/common-mistakes.md#event-time-columns).
    assert out.schema.field("window_start").type == pa.timestamp("us", tz="UTC")
    t = pa.array([0, 60_000, 120_000], pa.timestamp("ms", tz="UTC")).to_pylist()
    assert fired(out) == [("a", t[0], t[1], 2), ("a", t[1], t[2], 1)]


def test_window_configuration_errors_are_clear() -> None:
    with pytest.raises(ConfigError, match="window size once"):
        TumblingWindow("w", ["k"], "ts")
    with pytest.raises(ConfigError, match="value_column is not set"):
        TumblingWindow("w", ["k"], "ts", size_ms=10, aggs=("count", "sum"))
    with pytest.raises(ConfigError, match="clash"):
        TumblingWindow("w", ["window_start"], "ts", size_ms=10)


def test_a_fresh_operator_instance_fires_with_key_types_recorded_in_state(tmp_path: Path) -> None:
    def make() -> TumblingWindow:  # each Spark task unpickles its own copy of the operator
        return TumblingWindow("w", ["day", "n"], "ts", size_ms=10)

    rows = with_key_groups(pa.table({"day": pa.array([19_000], pa.date32()), "n": pa.array([7], pa.int16()),
                                     "ts": [3]}), ["day", "n"])
    run_epoch(tmp_path, make(), rows, ctx(0, None))
    # The operator itself, not the worker step: the runtime always ships a resolved copy,
    # this checks the operator still knows its key types from state alone.
    with SubtaskStateStore.open(store_path(tmp_path, make())) as store:
        out = make().apply(store, pa.table({}), ctx(1, None, final=True))
    assert out.schema.field("day").type == pa.date32() and out.schema.field("n").type == pa.int16()
    assert out.select(["day", "n", "count"]).to_pylist() == rows.select(["day", "n"]).append_column(
        "count", pa.array([1], pa.int64())).to_pylist()


def state_writes(store: SubtaskStateStore) -> dict:
    """The epoch's pending writes to keyed state (not store metadata such as key types)."""
    return {k: v for k, v in store.pending_changes().items() if not k.startswith(META_PREFIX)}


def test_a_subtasks_windows_are_one_entry_per_key_group_and_a_group_without_windows_has_none(tmp_path: Path) -> None:
    """No entry per window and no fire or clean-up index: an epoch writes one table per
    key group it changed (W2's epochs were bound by per-window state writes)."""
    op = TumblingWindow("w", ["key"], "ts", size="10 s")
    rows = events(*[(f"k{i}", 1_000 + i) for i in range(40)])
    groups = set(rows.column("__kg").to_pylist())
    assert 1 < len(groups) < 40
    op.resolve_input_schema(rows.schema)
    with SubtaskStateStore.open(str(tmp_path / "db")) as store:
        assert fired(op.apply(store, rows, ctx(0, 5_000))) == []
        assert sorted(int.from_bytes(k[:2], "big") for k in state_writes(store)) == sorted(groups)
        store.commit_epoch(0, op.output_schema.empty_table())
        assert len(fired(op.apply(store, events(), ctx(1, 10_000)))) == 40
        changes = state_writes(store)
        assert len(changes) == len(groups) and all(v is None for v in changes.values())  # fired, so gone
        store.commit_epoch(1, op.output_schema.empty_table())
        assert [k for k, _ in store.scan_range(b"", b"\xff\xff")] == []


def test_a_window_whose_lateness_has_passed_when_it_fires_leaves_no_state(tmp_path: Path) -> None:
    op = TumblingWindow("w", ["key"], "ts", size="10 s", allowed_lateness="5 s")
    assert fired(run_epoch(tmp_path, op, events(("a", 1_000), ("b", 12_000)), ctx(0, 5_000))) == []
    # one watermark step past a's end + lateness: a fires once and is gone; b still waits
    assert fired(run_epoch(tmp_path, op, events(), ctx(1, 15_000))) == [("a", 0, 10_000, 1)]
    assert fired(run_epoch(tmp_path, op, events(("a", 2_000)), ctx(2, 15_000))) == []  # late: dropped
    assert dropped(tmp_path, op) == 1
    assert fired(run_epoch(tmp_path, op, events(), ctx(3, 40_000))) == [("b", 10_000, 20_000, 1)]
    with SubtaskStateStore.open(store_path(tmp_path, op)) as store:
        assert [k for k, _ in store.scan_range(b"", b"\xff\xff")] == []
