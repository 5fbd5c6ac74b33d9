"""Time to live of value, list and map state, as Spark's transformWithState keeps it:
processing time, each write restarts the value's expiry, expired values are invisible
at once and leave the store at the end of the epoch. Driven by the ProcessorTester's
manual processing-time clock."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pandas as pd
import pyarrow as pa
import pytest

from sparkpoint import ProcessorOperator, StatefulProcessor
from sparkpoint.api.processor import ProcessorOperator as _Op
from sparkpoint.errors import ConfigError
from sparkpoint.state.interfaces import EpochContext
from sparkpoint.state.store import SubtaskStateStore
from sparkpoint.testing import ProcessorTester

TTL = 10_000


class Visits(StatefulProcessor):
    """Per user: the visits since the count last expired (value), the pages of the
    visits (list, one expiry per element) and, per page, its last visit (map)."""

    def init(self, handle) -> None:
        self.count = handle.getValueState("count", "n BIGINT", TTL)
        self.pages = handle.getListState("pages", "page STRING", TTL)
        self.last = handle.getMapState("last", "page STRING", "at BIGINT", TTL)

    def handle_input_rows(self, key, rows: pd.DataFrame, timer_values) -> Iterator[pd.DataFrame]:
        had = self.count.exists()
        n = (self.count.get() or (0,))[0] + len(rows)
        self.count.update((n,))
        now = timer_values.getCurrentProcessingTimeInMs()
        for page in rows["page"]:
            self.pages.appendValue((page,))
            self.last.updateValue((page,), (now,))
        yield pd.DataFrame({"user": [key[0]], "had_count": [had], "n": [n],
                            "pages": [len(list(self.pages.get()))], "map_entries": [len(list(self.last.keys()))]})


OUTPUT = "user STRING, had_count BOOLEAN, n BIGINT, pages BIGINT, map_entries BIGINT"


def visits() -> ProcessorOperator:
    return ProcessorOperator("visits", Visits, ["user"], OUTPUT)


def visit(user: str, *pages: str) -> pd.DataFrame:
    return pd.DataFrame({"user": [user] * len(pages), "page": list(pages)})


def test_a_value_is_visible_until_its_ttl_passes_then_gone_for_get_exists_and_the_reader() -> None:
    tester = ProcessorTester(visits())
    tester.process(visit("ann", "home"))
    tester.set_processing_time(TTL - 1)
    assert tester.peek_value_state("count", "ann") == (1,)
    tester.set_processing_time(TTL)  # Spark: expired once the batch time reaches the expiry
    assert tester.peek_value_state("count", "ann") is None
    assert tester.peek_list_state("pages", "ann") == []
    assert tester.peek_map_state("last", "ann") == {}
    assert tester.state().empty  # purged: the reader, reading the store, finds nothing
    out = tester.process(visit("ann", "cart"))
    assert out.to_dict("records") == [{"user": "ann", "had_count": False, "n": 1, "pages": 1, "map_entries": 1}]


def test_each_write_restarts_the_ttl_of_what_it_wrote_and_only_that() -> None:
    tester = ProcessorTester(visits())
    tester.process(visit("ann", "home"))                      # t=0: count, pages[home], last[home]
    tester.set_processing_time(6_000)
    out = tester.process(visit("ann", "cart"))               # t=6000: count rewritten, pages+cart, last[cart]
    assert out.to_dict("records") == [{"user": "ann", "had_count": True, "n": 2, "pages": 2, "map_entries": 2}]
    tester.set_processing_time(TTL)                           # what t=0 wrote and nobody rewrote is gone
    assert tester.peek_value_state("count", "ann") == (2,)
    assert tester.peek_list_state("pages", "ann") == [("cart",)]
    assert tester.peek_map_state("last", "ann") == {("cart",): (6_000,)}
    tester.set_processing_time(6_000 + TTL)
    assert tester.peek_value_state("count", "ann") is None and tester.state().empty


def test_the_processor_itself_sees_an_expired_value_as_absent_within_the_epoch() -> None:
    tester = ProcessorTester(visits())
    tester.process(visit("bob", "a", "b"))
    tester.advance_processing_time(TTL)
    out = tester.process(visit("bob", "c"))
    assert out.to_dict("records") == [{"user": "bob", "had_count": False, "n": 1, "pages": 1, "map_entries": 1}]


def test_expiry_holds_across_a_snapshot_and_a_restore() -> None:
    tester = ProcessorTester(visits())
    tester.process(visit("ann", "home"))
    tester.set_processing_time(4_000)
    tester.process(visit("cid", "home"))
    restored = ProcessorTester.from_snapshot(visits(), tester.snapshot())
    assert restored.processing_time_ms == 4_000
    restored.set_processing_time(TTL)
    assert restored.peek_value_state("count", "ann") is None
    assert restored.peek_value_state("count", "cid") == (1,)
    assert sorted(restored.state()["user"]) == ["cid"]
    restored.set_processing_time(4_000 + TTL)
    assert restored.state().empty


def test_expired_values_and_their_index_entries_leave_the_store(tmp_path: Path) -> None:
    """State does not grow: after the clean-up the store holds only live values, their
    index entries and the list heads of lists that still have elements."""
    op = visits()
    rows = pa.Table.from_pandas(pd.concat([visit(f"u{i}", "p", "q") for i in range(20)]), preserve_index=False)
    op.resolve_input_schema(rows.schema)
    rows = rows.append_column("__kg", pa.array([i % 128 for i in range(rows.num_rows)], pa.int32()))

    def epoch(store, table: pa.Table, now: int) -> None:
        op.apply(store, table, EpochContext(0, 0, 1, 128, None, now))

    with SubtaskStateStore.open(str(tmp_path / "db")) as store:
        epoch(store, rows, 0)
        written = sum(1 for _ in store.scan_range(b"\x00", b"\xff\xff"))
        assert written > 0
        epoch(store, rows.slice(0, 0), TTL - 1)
        assert sum(1 for _ in store.scan_range(b"\x00", b"\xff\xff")) == written
        epoch(store, rows.slice(0, 2), TTL)  # u0 writes again; everything else expired
        left = [k for k, _ in store.scan_range(b"\x00", b"\xff\xff")]
        epoch(store, rows.slice(0, 0), 2 * TTL)
        assert [k for k, _ in store.scan_range(b"\x00", b"\xff\xff")] == []
    assert 0 < len(left) < written / 10


@pytest.mark.parametrize("ttl, message", [
    (0, "ttlDurationMs of state 'n' is 0; a time to live must be positive"),
    (-5, "is -5; a time to live must be positive"),
    ("soon", "'soon' is not a duration"),
])
def test_a_bad_ttl_is_refused_in_one_line(ttl, message) -> None:
    class Bad(StatefulProcessor):
        def init(self, handle) -> None:
            handle.getValueState("n", "n BIGINT", ttl)

    tester = ProcessorTester(ProcessorOperator("bad", Bad, ["user"], OUTPUT))
    with pytest.raises(ConfigError, match=message) as e:
        tester.process(visit("ann", "x"))
    assert "processor 'bad'" in str(e.value) and "\n" not in str(e.value)


def test_a_ttl_can_be_a_duration_string() -> None:
    class Minutes(Visits):
        def init(self, handle) -> None:
            self.count = handle.getValueState("count", "n BIGINT", "1 min")
            self.pages = handle.getListState("pages", "page STRING")
            self.last = handle.getMapState("last", "page STRING", "at BIGINT")

    tester = ProcessorTester(_Op("m", Minutes, ["user"], OUTPUT))
    tester.process(visit("ann", "x"))
    tester.set_processing_time(59_999)
    assert tester.peek_value_state("count", "ann") == (1,)
    tester.set_processing_time(60_000)
    assert tester.peek_value_state("count", "ann") is None
    assert tester.peek_list_state("pages", "ann") == [("x",)]  # declared without a TTL: kept
