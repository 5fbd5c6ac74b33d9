"""A `TumblingWindow`'s state as one Arrow table per key group: the output equals a pandas
reference under late rows within and beyond the allowed lateness (re-fires, drops, the
final epoch), a restore midway from a snapshot continues like the run that never
stopped, and a store written by the per-window layout (one record per window plus fire
and clean-up index entries, `per_window_layout.py`) restores and continues with the
results of that layout's own code; the state reader reads both layouts alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from operator_support import ctx, run_partitioned, store_path, with_key_groups
from per_window_layout import TumblingWindow as PerWindowLayout

from sparkpoint.api import TumblingWindow
from sparkpoint.api.state_schema import describe
from sparkpoint.errors import StateSchemaError
from sparkpoint.state import dump
from sparkpoint.state.key_decode import split_namespace
from sparkpoint.state.keys import META_PREFIX
from sparkpoint.state.store import SubtaskStateStore
from sparkpoint.testing.harness import ProcessorTester

SIZE, LATENESS, DELAY = 1_000, 1_500, 300
KEYS = {"string": list("abcdefg"), "integer": [-7, 0, 12, 1 << 40, 5], "float": [-2.5, 0.0, 1.5, 3.25]}


def _epochs(names: list, n_epochs: int = 14, seed: int = 7) -> list[tuple[pd.DataFrame, int]]:
    """Out-of-order events; some arrive after their window's end + lateness. Each epoch
    with the watermark in effect for it (the largest event time so far minus DELAY)."""
    rng = np.random.default_rng(seed)
    clock, seen, out = 0, -(1 << 40), []
    for _ in range(n_epochs):
        n = 200
        ts = clock + rng.integers(-4 * SIZE, 600, n)
        df = pd.DataFrame({"key": rng.choice(names, n), "shard": rng.integers(0, 2, n), "ts": ts,
                           "v": rng.integers(0, 100, n)})
        watermark = None if seen < 0 else seen - DELAY
        out.append((df, watermark))
        seen = max(seen, int(ts.max()))
        clock += 500
    return out


def _partials(df: pd.DataFrame) -> pa.Table:
    """Spark's pre-aggregation per (key, window_start)."""
    df = df.assign(window_start=df.ts - df.ts % SIZE)
    partial = df.groupby(["key", "shard", "window_start"]).agg(__count=("v", "size"), __sum=("v", "sum"))
    return with_key_groups(pa.Table.from_pandas(partial.reset_index(), preserve_index=False), ["key", "shard"])


def _window(op_class=TumblingWindow):
    return op_class("w", ["key", "shard"], "ts", size_ms=SIZE, allowed_lateness_ms=LATENESS,
                    aggs=("count", "sum"), value_column="v", value_type="bigint")


def _run(tmp_path: Path, epochs, ops, parallelism: int = 2) -> list[pa.Table]:
    """Epoch i runs with ops[i] (the same step name: its state carries on), then the final epoch."""
    outputs = []
    for i, (df, watermark) in enumerate(epochs):
        outputs.append(run_partitioned(tmp_path, ops[i], _partials(df), ctx(i, watermark), parallelism))
    empty = _partials(epochs[0][0]).slice(0, 0)
    outputs.append(run_partitioned(tmp_path, ops[-1], empty, ctx(len(epochs), epochs[-1][1], final=True),
                                   parallelism))
    return outputs


def _frame(out: pa.Table) -> pd.DataFrame:
    return out.to_pandas().sort_values(["window_start", "key", "shard"]).reset_index(drop=True)


def _reference(epochs) -> tuple[pd.DataFrame, int]:
    """Per (key, shard, window): the totals over the rows not dropped, and how many rows
    were dropped (a row is dropped when its window's end + lateness <= the watermark in
    effect for its epoch)."""
    rows = pd.concat([df.assign(wm=np.nan if wm is None else wm) for df, wm in epochs])
    rows["window_start"] = rows.ts - rows.ts % SIZE
    late = rows.window_start + SIZE + LATENESS <= rows.wm
    kept = rows[~late]
    totals = kept.groupby(["key", "shard", "window_start"]).agg(count=("v", "size"), sum=("v", "sum"))
    return totals.sort_index(), int(late.sum())


def _check_against_reference(outputs: list[pa.Table], epochs) -> None:
    got = pd.concat([o.to_pandas().assign(epoch=i) for i, o in enumerate(outputs)])
    assert not got.duplicated(["key", "shard", "window_start", "epoch"]).any()  # a window fires once per epoch
    expected, _ = _reference(epochs)
    last = got.sort_values("epoch").groupby(["key", "shard", "window_start"])[["count", "sum"]].last()
    pd.testing.assert_frame_equal(last.sort_index(), expected, check_dtype=False)


def _dropped(tmp_path: Path, op, parallelism: int = 2) -> int:
    total = 0
    for s in range(parallelism):
        with SubtaskStateStore.open(store_path(tmp_path, op, s)) as store:
            total += op.dropped_count(store)
    return total


@pytest.mark.parametrize("keys", list(KEYS), ids=list(KEYS))
def test_late_rows_refire_within_lateness_are_dropped_beyond_it_and_final_fires_the_rest(tmp_path: Path,
                                                                                        keys: str) -> None:
    epochs = _epochs(KEYS[keys])
    outputs = _run(tmp_path, epochs, [_window()] * len(epochs))
    _check_against_reference(outputs, epochs)
    got = pd.concat([o.to_pandas() for o in outputs])
    assert got.duplicated(["key", "shard", "window_start"]).any(), "the input made no window fire again"
    assert _dropped(tmp_path, _window()) == _reference(epochs)[1] > 0
    for s in range(2):  # the final epoch fired and removed every window
        with SubtaskStateStore.open(store_path(tmp_path, _window(), s)) as store:
            assert list(store.scan_range(b"", META_PREFIX)) == []


@pytest.mark.parametrize("keys", ["string", "integer"])
def test_a_store_of_the_per_window_layout_restores_and_continues_like_that_layouts_own_code(tmp_path: Path,
                                                                                          keys: str) -> None:
    epochs = _epochs(KEYS[keys], seed=11)
    old, new, half = _window(PerWindowLayout), _window(), len(epochs) // 2
    reference = _run(tmp_path / "old", epochs, [old] * len(epochs))
    for s in range(2):
        with SubtaskStateStore.open(store_path(tmp_path / "old", old, s)) as store:
            assert op_namespaces(store) <= {"win", "win-fire", "win-cleanup"}
    mixed = _run(tmp_path / "mixed", epochs, [old] * half + [new] * (len(epochs) - half))
    for i, (want, got) in enumerate(zip(reference, mixed)):
        pd.testing.assert_frame_equal(_frame(got), _frame(want), obj=f"epoch {i}")
    _check_against_reference(mixed, epochs)
    assert _dropped(tmp_path / "mixed", new) == _dropped(tmp_path / "old", old)


def op_namespaces(store: SubtaskStateStore) -> set[str]:
    return {split_namespace(k)[1] for k, _ in store.scan_range(b"", META_PREFIX)}


def test_the_first_epoch_on_a_per_window_store_leaves_only_window_tables(tmp_path: Path) -> None:
    epochs = _epochs(KEYS["string"], n_epochs=4)
    old, new = _window(PerWindowLayout), _window()
    new.resolve_input_schema(_partials(epochs[0][0]).schema)
    for i, (df, wm) in enumerate(epochs[:3]):
        run_partitioned(tmp_path, old, _partials(df), ctx(i, wm), 1)
    with SubtaskStateStore.open(store_path(tmp_path, old)) as store:
        assert {"win", "win-fire", "win-cleanup"} <= op_namespaces(store)
        before = _read(store, new)
    run_partitioned(tmp_path, new, _partials(epochs[3][0]).slice(0, 0), ctx(3, epochs[2][1]), 1)
    with SubtaskStateStore.open(store_path(tmp_path, new)) as store:
        assert op_namespaces(store) == {"win-table"}
        after = _read(store, new)
    # Same watermark, no rows: nothing fired, the state moved as it was.
    for b, a in zip(before, after):
        pd.testing.assert_frame_equal(a, b)


def _read(store: SubtaskStateStore, op) -> tuple[pd.DataFrame, pd.DataFrame]:
    entries = list(store.scan_range(b"", META_PREFIX))
    desc = describe(op)
    state = pa.concat_tables(dump.read_state(entries, desc)).to_pandas()
    timers = pa.concat_tables([*dump.read_timers(entries, desc), desc.timer_schema().empty_table()]).to_pandas()
    return state, timers


@pytest.mark.parametrize("keys", ["string", "float"])
def test_the_state_reader_reads_window_tables_as_it_read_the_per_window_layout(tmp_path: Path, keys: str) -> None:
    epochs = _epochs(KEYS[keys], n_epochs=6)
    old, new = _window(PerWindowLayout), _window()
    for i, (df, wm) in enumerate(epochs):
        run_partitioned(tmp_path / "old", old, _partials(df), ctx(i, wm), 1)
        run_partitioned(tmp_path / "new", new, _partials(df), ctx(i, wm), 1)
    with SubtaskStateStore.open(store_path(tmp_path / "old", old)) as a, \
            SubtaskStateStore.open(store_path(tmp_path / "new", new)) as b:
        (old_state, old_timers), (new_state, new_timers) = _read(a, new), _read(b, new)
    assert len(old_state) and old_state.fired.any() and (~old_state.fired).any()
    pd.testing.assert_frame_equal(new_state, old_state)
    pd.testing.assert_frame_equal(new_timers, old_timers)


def test_a_restore_from_a_snapshot_midway_continues_like_the_run_that_never_stopped() -> None:
    """The tester's watermark is the largest event time of earlier epochs minus DELAY, as in
    `_epochs`; its epochs take raw rows."""
    epochs = _epochs(KEYS["string"], seed=5)
    cols = ["key", "shard", "window_start", "window_end", "count", "sum"]

    def feed(tester: ProcessorTester, part) -> list[pd.DataFrame]:
        return [tester.process(df) for df, _ in part]

    straight = ProcessorTester(_window(), watermark=("ts", DELAY))
    want = feed(straight, epochs) + [straight.finish()]
    first = ProcessorTester(_window(), watermark=("ts", DELAY))
    got = feed(first, epochs[:7])
    restored = ProcessorTester.from_snapshot(_window(), first.snapshot(), watermark=("ts", DELAY))
    got += feed(restored, epochs[7:]) + [restored.finish()]
    for i, (w, g) in enumerate(zip(want, got)):
        pd.testing.assert_frame_equal(g[cols].reset_index(drop=True), w[cols].reset_index(drop=True), obj=f"epoch {i}")
    assert restored.late_rows_dropped == straight.late_rows_dropped == _reference(epochs)[1] > 0
    _check_against_reference([pa.Table.from_pandas(g[cols], preserve_index=False) for g in got], epochs)


def test_a_window_table_entry_the_reader_cannot_decode_is_one_line_saying_so() -> None:
    op = _window()
    op.resolve_input_schema(_partials(_epochs(KEYS["string"], n_epochs=1)[0][0]).schema)
    entry = (5).to_bytes(2, "big") + bytes([len(b"win-table")]) + b"win-table"
    with pytest.raises(StateSchemaError, match=r"window step 'w', key group 5: a window table entry is not an Arrow "
                                               r"IPC stream .*not written by a TumblingWindow of this version"):
        list(dump.read_state([(entry, b"not arrow")], describe(op)))
