"""SessionWindow's session tables (one Arrow table of open sessions per key group)
against the per-session engine they replace for one-column aggregates: the same rows
epoch by epoch, the same rows dropped, the same state read back, over randomized
out-of-order epochs whose late rows bridge stored sessions and re-fire them; and a
store the engine wrote keeps the engine."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest
from operator_support import MAX_PARALLELISM, ctx, run_partitioned, store_path, with_key_groups
from windows_support import (AGGREGATE_SETS, AGGS, as_rows, engine_then_tables, random_epochs, run_beside_the_engine,
                             run_in_tester, session_reference, states_beside_the_engine, stored_entries,
                             stored_namespaces, watermarks)

from sparkpoint import SessionWindow
from sparkpoint.api.windows.base import WindowOperator
from sparkpoint.api.windows.session_table_state import SessionTables, _running_max
from sparkpoint.state.keys import META_PREFIX, key_group_range, namespace
from sparkpoint.state.store import SubtaskStateStore
from sparkpoint.testing import ProcessorTester

DELAY = 2_000
GAP = 1_500
GAPS = [0, 500, 1_500, 4_000, None]
_TABLES, _RECORDS = namespace("session-tables"), namespace("session")


class EngineSession(SessionWindow):
    """The per-session engine, whatever the store holds."""

    def apply(self, store, rows, ctx):
        return WindowOperator.apply(self, store, rows, ctx)


def _step(cls, mode: str, lateness: int, dynamic: bool, aggs=AGGS, value_type: str = "double"):
    gap = {"gap_column": "gap"} if dynamic else {"gap": GAP}
    return cls("sessions", ["k"], "ts", aggs=aggs, value_column=None if aggs == ("count",) else "v",
               allowed_lateness=lateness, output_mode=mode, value_type=value_type, **gap)


def _gap_of(dynamic: bool):
    if not dynamic:
        return lambda r: GAP
    return lambda r: None if pd.isna(r.gap) else int(r.gap)


def _epochs(seed: int, dynamic: bool, **kwargs):
    return random_epochs(seed=seed, gaps=GAPS if dynamic else None, **kwargs)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed-gap", "gap-column"])
@pytest.mark.parametrize("lateness", [0, 3_000], ids=["no-lateness", "lateness"])
@pytest.mark.parametrize("mode", ["final", "update"])
def test_session_tables_emit_what_the_per_session_engine_emits_epoch_by_epoch(mode, lateness, dynamic, seed) -> None:
    epochs = _epochs(seed, dynamic, epochs=10, keys="abcdefg")
    out, dropped = run_beside_the_engine(lambda: _step(SessionWindow, mode, lateness, dynamic),
                                         lambda: _step(EngineSession, mode, lateness, dynamic), epochs, DELAY)
    assert dropped > 0
    assert any(r[-1] for epoch in out for r in epoch)  # late rows joined sessions behind the watermark
    expected, expected_dropped = session_reference(epochs, _gap_of(dynamic), DELAY, lateness, mode)
    assert (out, dropped) == (expected, expected_dropped)


@AGGREGATE_SETS
@pytest.mark.parametrize("mode", ["final", "update"])
def test_session_tables_equal_the_engine_for_each_aggregate_set(mode, aggs, value_type, columns) -> None:
    epochs = _epochs(11, True, epochs=9, keys="abcde")

    def run(cls):
        return run_in_tester(lambda: _step(cls, mode, 3_000, True, aggs, value_type), epochs, DELAY,
                             columns=columns)[:2]
    assert run(SessionWindow) == run(EngineSession)


@pytest.mark.parametrize("mode", ["final", "update"])
def test_late_rows_that_bridge_stored_sessions_re_fire_the_merged_session_as_the_engine_does(mode) -> None:
    """Sessions that fired are bridged by a late row into one (late), then extended
    on time (still late) and flushed by the end of input."""
    epochs = [[{"k": "a", "ts": 0, "v": 1.0}, {"k": "a", "ts": 2_000, "v": 2.0}, {"k": "b", "ts": 3_200, "v": 4.0}],
              [{"k": "a", "ts": 1_000, "v": 8.0}, {"k": "b", "ts": 9_000, "v": None}],
              [{"k": "a", "ts": 2_900, "v": 16.0}, {"k": "a", "ts": 20_000, "v": 32.0}],
              [{"k": "b", "ts": 4_000, "v": 64.0}]]

    def run(cls):
        tester = ProcessorTester(cls("s", ["k"], "ts", gap="1 s", aggs=AGGS, value_column="v",
                                     allowed_lateness="10 s", output_mode=mode), watermark=("ts", 2_000))
        out = [as_rows(tester.process(rows)) for rows in epochs]
        return out + [as_rows(tester.finish())], tester.late_rows_dropped
    tables, engine = run(SessionWindow), run(EngineSession)
    assert tables == engine
    assert any(r[-1] and r[3] >= 3 for epoch in tables[0] for r in epoch)  # a bridged session, marked late


@pytest.mark.parametrize("mode", ["final", "update"])
def test_a_session_window_keeps_one_session_table_per_key_group_and_no_per_session_entries(mode) -> None:
    tester = ProcessorTester(_step(SessionWindow, mode, 3_000, False), watermark=("ts", DELAY))
    for rows in _epochs(3, False, epochs=4, keys="abcdefgh"):
        tester.process(rows)
    assert stored_namespaces(tester) == {_TABLES}
    assert len(stored_entries(tester)) <= 8  # at most one entry per key group, and 8 keys
    tester.finish()
    assert stored_entries(tester) == []


@pytest.mark.parametrize("mode", ["final", "update"])
def test_a_store_the_per_session_engine_wrote_keeps_the_engine_after_a_restore(mode) -> None:
    epochs = _epochs(5, True, epochs=8)
    out, tester = engine_then_tables(lambda: _step(EngineSession, mode, 3_000, True),
                                     lambda: _step(SessionWindow, mode, 3_000, True), epochs, DELAY)
    assert stored_namespaces(tester) == {_RECORDS, namespace("session-due")}
    out.append(as_rows(tester.finish()))
    expected, expected_dropped = session_reference(epochs, _gap_of(True), DELAY, 3_000, mode)
    assert (out, tester.late_rows_dropped) == (expected, expected_dropped)


@pytest.mark.parametrize("mode", ["final", "update"])
def test_session_tables_split_over_three_subtasks_stay_in_their_key_groups_and_equal_the_reference(
        tmp_path, mode) -> None:
    """Through the runtime's worker step, split by subtask: each subtask keeps its
    groups' tables under its own key groups (what a rescale re-cuts and moves), and
    fires and cleans up only those."""
    epochs = random_epochs(seed=9, keys="abcdefgh", gaps=[500, 1_500, 4_000])
    step = _step(SessionWindow, mode, 3_000, True)
    expected, _ = session_reference(epochs, _gap_of(True), DELAY, 3_000, mode)
    marks = watermarks(epochs, DELAY)
    got, held = [], 0
    for e, rows in enumerate([*epochs, None]):
        table = with_key_groups(pa.Table.from_pandas(rows if rows is not None else epochs[0].iloc[:0],
                                                     preserve_index=False), ["k"])
        context = ctx(e, None, final=True) if rows is None else ctx(e, marks[e])
        got.append(as_rows(run_partitioned(tmp_path, step, table, context, 3).to_pandas()))
        for s in range(3):
            with SubtaskStateStore.open(store_path(tmp_path, step, s)) as store:
                keys = [k for k, _ in store.scan_range(b"", META_PREFIX)]
            assert {k[2:3 + k[2]] for k in keys} <= {_TABLES}
            assert {int.from_bytes(k[:2], "big") for k in keys} <= set(key_group_range(s, 3, MAX_PARALLELISM))
            held += len(keys)
    assert held > 0, "no subtask ever held state: the check above proves nothing"
    assert got == expected


@pytest.mark.parametrize("mode", ["final", "update"])
def test_the_state_reader_reads_session_tables_as_the_engine_held_its_sessions(mode) -> None:
    state_columns = ["k", "window_start", "window_end", "count", "sum", "min", "max", "avg", "fired", "late"]
    seen = 0
    for states, timers in states_beside_the_engine(lambda: _step(SessionWindow, mode, 3_000, True), SessionTables,
                                                   _epochs(9, True, epochs=8), DELAY, state_columns):
        assert states[0] == states[1]
        assert timers[0] == timers[1]
        seen += len(states[0])
    assert seen > 0


def test_the_running_maximum_restarts_per_key_also_where_times_are_far_apart() -> None:
    import numpy as np

    values = np.array([5, 3, 9, 1, -2**62, 2**62, 7, 0], dtype=np.int64)
    first = np.array([1, 0, 0, 1, 1, 0, 1, 0], dtype=bool)
    expected = [5, 5, 9, 1, -2**62, 2**62, 7, 7]
    assert _running_max(values, first).tolist() == expected
    assert _running_max(values[:4], first[:4]).tolist() == expected[:4]
    assert pa.array(_running_max(values[:0], first[:0])).to_pylist() == []


@pytest.mark.parametrize("mode", ["final", "update"])
def test_session_tables_tell_keys_of_two_columns_apart_null_parts_included(mode) -> None:
    epochs = []
    for rows in _epochs(13, False, epochs=8, keys="ab"):
        rows["n"] = pd.array([None if t % 3 == 0 else int(t % 2) for t in rows["ts"]], dtype="Int64")
        epochs.append(rows)
    columns = ["k", "n", "window_start", "window_end", "count", "sum", "late"]

    def rows_of(df) -> list[tuple]:
        return sorted((tuple(None if pd.isna(v) else v for v in r) for r in df[columns].itertuples(index=False)),
                      key=repr)

    def run(cls):
        tester = ProcessorTester(cls("s", ["k", "n"], "ts", gap=GAP, aggs=("count", "sum"), value_column="v",
                                     allowed_lateness=3_000, output_mode=mode), watermark=("ts", DELAY))
        out = [rows_of(tester.process(rows)) for rows in epochs]
        return out + [rows_of(tester.finish())], tester.late_rows_dropped
    tables, engine = run(SessionWindow), run(EngineSession)
    assert tables == engine
    assert any(r[1] is None for epoch in tables[0] for r in epoch)
