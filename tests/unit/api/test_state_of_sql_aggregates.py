"""The state reader on steps with Spark SQL aggregates (what `sparkpoint.read_state`
returns, here through the test harness, which decodes a store as the reader's Spark
tasks do): a KeyedAggregate's state equals a recomputation over every row of each key;
a window step's state holds each window its store still keeps, with the values it last
emitted in update mode (an output checked against an independent reference in
test_windows_sql_aggregates.py). A fresh operator object, which has seen no rows, reads
the same: the partial types come from the store."""

from __future__ import annotations

import pandas as pd
import pytest
from test_sql_aggregates import AGGS as KEYED_AGGS, expected, plain, random_epochs as keyed_epochs
from test_windows_sql_aggregates import AGGS, NAMES, with_strings
from windows_support import as_rows, random_epochs, watermarks

from sparkpoint import CumulateWindow, KeyedAggregate, SessionWindow, SlidingWindow, TumblingWindow
from sparkpoint.api.state_schema import complete_from_store, describe, sql_partials
from sparkpoint.errors import StateSchemaError
from sparkpoint.state import dump
from sparkpoint.state.descriptor import OperatorStateSchema
from sparkpoint.state.key_decode import split_namespace
from sparkpoint.testing import ProcessorTester

DELAY, LATENESS = 2_000, 3_000


def keyed() -> KeyedAggregate:
    return KeyedAggregate("stats", ["k"], aggs=KEYED_AGGS)


def test_a_keyed_aggregates_state_equals_every_aggregate_recomputed_over_all_rows_of_each_key() -> None:
    seen: dict[str, list[tuple]] = {}
    tester = ProcessorTester(keyed())
    for e, rows in enumerate(keyed_epochs(seed=5)):
        for r in rows.itertuples(index=False):
            seen.setdefault(r.k, []).append((r.k, None if pd.isna(r.v) else int(r.v), r.s, bool(r.cheap)))
        tester.process(rows)
        state = tester.state()
        assert list(state.columns) == ["k", *[a.rsplit(" AS ", 1)[1] for a in KEYED_AGGS]]
        assert sorted(state["k"]) == sorted(seen)
        for row in state.to_dict("records"):
            assert plain(row) == {"k": row["k"], **expected(seen[row["k"]])}, (e, row["k"])
        if e == 2:  # a fresh step object: partial types and key types come from the store
            tester = ProcessorTester.from_snapshot(keyed(), tester.snapshot().to_json())
            pd.testing.assert_frame_equal(tester.state(), state)


WINDOWS = {
    "sliding": lambda: SlidingWindow("w", ["k"], "ts", size=10_000, slide=4_000, aggs=AGGS,
                                     allowed_lateness=LATENESS, output_mode="update"),
    "tumbling": lambda: TumblingWindow("w", ["k"], "ts", size="5 s", aggs=AGGS, allowed_lateness=LATENESS,
                                       output_mode="update"),
    "cumulate": lambda: CumulateWindow("w", ["k"], "ts", step=3_000, size=12_000, aggs=AGGS,
                                       allowed_lateness=LATENESS, output_mode="update"),
    "session": lambda: SessionWindow("w", ["k"], "ts", gap=700, aggs=AGGS, allowed_lateness=LATENESS,
                                     output_mode="update"),
}
COLUMNS = ["k", "window_start", "window_end", *NAMES]


@pytest.mark.parametrize("kind", list(WINDOWS))
def test_a_windows_state_holds_its_open_windows_with_the_values_it_last_emitted(kind: str) -> None:
    epochs = with_strings(random_epochs(seed=13))
    tester = ProcessorTester(WINDOWS[kind](), watermark=("ts", DELAY))
    last: dict[tuple, tuple] = {}  # (key, start, end) -> the window's last update row
    held_at_some_point = 0
    for e, (rows, w) in enumerate(zip(epochs, watermarks(epochs, DELAY))):
        out = tester.process(rows)
        for r in as_rows(out, COLUMNS):
            last[r[:3]] = r
        state = tester.state()
        assert list(state.columns) == [*COLUMNS, "fired", "late"]
        got = as_rows(state, COLUMNS)
        assert got == sorted(last[r[:3]] for r in got), e  # every held window: its last emitted values
        if kind != "session":  # a session absorbed by a later one is no longer held; the rest hold every open one
            still_open = {k for k in last if w is None or k[2] + LATENESS > w}
            assert {r[:3] for r in got} == still_open, e
        held_at_some_point = max(held_at_some_point, len(got))
        if e == 3:
            tester = ProcessorTester.from_snapshot(WINDOWS[kind](), tester.snapshot().to_json(),
                                                   watermark=("ts", DELAY))
            assert as_rows(tester.state(), COLUMNS) == got
    assert held_at_some_point > 5


def test_a_sql_window_reads_its_timers_from_its_records() -> None:
    tester = ProcessorTester(WINDOWS["sliding"](), watermark=("ts", DELAY))
    for rows in with_strings(random_epochs(seed=13))[:3]:
        tester.process(rows)
    timers = tester.timers()
    windows = tester.state()
    assert sorted(zip(timers.window_start, timers.window_end)) == sorted(zip(windows.window_start,
                                                                             windows.window_end))
    assert set(timers.timer) == {"cleanup"}  # update mode: a window is only cleaned up
    assert (timers.expiry_ms == timers.window_end + LATENESS).all()


def test_the_recorded_schema_of_sql_aggregates_round_trips_and_reads_without_the_operator() -> None:
    tester = ProcessorTester(keyed())
    tester.process(keyed_epochs(seed=1, epochs=1)[0])
    desc = describe(tester.step)
    assert desc.sql_aggs == tuple(KEYED_AGGS) and desc.parts_schema is not None
    again = OperatorStateSchema.from_json(desc.to_json())
    assert again == desc and again.output_schema() == desc.output_schema()
    # Before a step has seen rows its partial types are unknown: the reader says so (the
    # runtime then reads them from a store).
    fresh = describe(keyed())
    assert fresh.needs_store_meta and fresh.sql_fields is None
    with pytest.raises(StateSchemaError, match="the types of its Spark SQL aggregates are not known"):
        fresh.with_key_schema(desc.key_schema).output_schema()
    with pytest.raises(StateSchemaError, match="keeps Spark SQL aggregate partials"):
        list(dump.read_state([], desc))


@pytest.mark.parametrize("lost", ["partials", "record"])
def test_the_state_reader_refuses_a_key_group_whose_window_records_and_partials_do_not_pair(lost: str) -> None:
    """A window with Spark SQL aggregates keeps its record and its partials in two
    namespaces; a key group holding one without the other was not written by this step,
    and the reader says so in one line naming the group rather than reading half a window."""
    tester = ProcessorTester(WINDOWS["sliding"](), watermark=("ts", DELAY))
    for rows in with_strings(random_epochs(seed=13))[:3]:
        tester.process(rows)
    state = tester._open_state()
    try:
        desc = complete_from_store(describe(tester.step), state.store.get_meta)
        entries = list(state.store.scan_range(b"", None))
    finally:
        state.store.discard_pending()
        state.close(keep=True)
    records = [k for k, _ in entries if split_namespace(k)[1] == desc.namespace]
    parts = [k for k, _ in entries if split_namespace(k)[1] == desc.namespace + "-parts"]
    group = split_namespace(records[0])[0]
    held = sum(split_namespace(k)[0] == group for k in records)
    assert held == sum(split_namespace(k)[0] == group for k in parts) > 0
    gone = next(k for k in (parts if lost == "partials" else records) if split_namespace(k)[0] == group)
    kept = [(k, v) for k, v in entries if k != gone]
    n_records, n_partials = (held, held - 1) if lost == "partials" else (held - 1, held)
    with pytest.raises(StateSchemaError) as refused:
        list(dump.read_state(kept, desc, partials=sql_partials(desc)))
    assert str(refused.value) == (f"window step 'w': key group {group} holds {n_records} window records and "
                                  f"{n_partials} aggregate partials, not one of each per window; its state is not "
                                  "one this step wrote")
