from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pandas as pd
import pyarrow as pa
import pytest
from operator_support import ctx, run_epoch, with_key_groups

from sparkpoint.api import ProcessorOperator, StatefulProcessor, StatefulProcessorHandle, TimerValues
from sparkpoint.errors import ConfigError, StateSchemaError


def clicks(*rows: tuple[str, str]) -> pa.Table:
    return with_key_groups(pa.table({"user": [u for u, _ in rows], "page": [p for _, p in rows]}), ["user"])


class RunningCount(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", "n BIGINT NOT NULL")

    def handle_input_rows(self, key, rows: pd.DataFrame, timer_values: TimerValues) -> Iterator[pd.DataFrame]:
        n = (self.count.get() or (0,))[0] + len(rows)
        self.count.update((n,))
        yield pd.DataFrame({"user": [key[0]], "n": [n]})


def test_running_count_per_key_with_value_state(tmp_path: Path) -> None:
    op = ProcessorOperator("counts", RunningCount, ["user"], "user STRING, n BIGINT")
    assert run_epoch(tmp_path, op, clicks(("bob", "x"), ("ann", "y"), ("bob", "z")), ctx(0)).to_pylist() == \
        [{"user": "ann", "n": 1}, {"user": "bob", "n": 2}]
    assert run_epoch(tmp_path, op, clicks(("bob", "x")), ctx(1)).to_pylist() == [{"user": "bob", "n": 3}]
    assert run_epoch(tmp_path, op, clicks(("ann", "x")), ctx(2)).to_pylist() == [{"user": "ann", "n": 2}]


class PySparkStyle(StatefulProcessor):
    """Written for PySpark: camelCase, rows arrive as an iterator of DataFrames."""

    def init(self, handle) -> None:
        self.seen = handle.getValueState("seen", "n BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        total = sum(len(pdf) for pdf in rows) + (self.seen.get() or (0,))[0]
        self.seen.update((total,))
        yield pd.DataFrame({"user": [key[0]], "n": [total]})


def test_pyspark_camel_case_processors_run_unchanged(tmp_path: Path) -> None:
    op = ProcessorOperator("counts", PySparkStyle(), ["user"], "user STRING, n BIGINT")
    run_epoch(tmp_path, op, clicks(("ann", "a")), ctx(0))
    assert run_epoch(tmp_path, op, clicks(("ann", "b"), ("ann", "c")), ctx(1)).to_pylist() == [{"user": "ann", "n": 3}]


class PageHistory(StatefulProcessor):
    def init(self, handle) -> None:
        self.recent = handle.getListState("recent", "page STRING")
        self.per_page = handle.getMapState("per_page", "page STRING", "visits BIGINT")

    def handle_input_rows(self, key, rows, timer_values):
        for page in rows["page"]:
            self.recent.appendValue((page,))
            self.per_page.updateValue((page,), ((self.per_page.getValue((page,)) or (0,))[0] + 1,))
        recent = [p for (p,) in self.recent.get()][-3:]
        self.recent.put([(p,) for p in recent])
        if self.per_page.containsKey(("reset",)):
            self.per_page.clear()
        summary = ",".join(f"{p}={v}" for (p,), (v,) in sorted(self.per_page.iterator()))
        yield pd.DataFrame({"user": [key[0]], "recent": ["/".join(recent)], "visits": [summary],
                            "has_map": [self.per_page.exists()]})


def test_list_and_map_state_keep_per_key_collections_across_epochs(tmp_path: Path) -> None:
    op = ProcessorOperator("history", PageHistory, ["user"],
                           "user STRING, recent STRING, visits STRING, has_map BOOLEAN")
    run_epoch(tmp_path, op, clicks(("ann", "a"), ("ann", "b"), ("bob", "a")), ctx(0))
    out = run_epoch(tmp_path, op, clicks(("ann", "c"), ("ann", "a")), ctx(1))
    assert out.to_pylist() == [{"user": "ann", "recent": "b/c/a", "visits": "a=2,b=1,c=1", "has_map": True}]
    out = run_epoch(tmp_path, op, clicks(("bob", "reset")), ctx(2))
    assert out.to_pylist() == [{"user": "bob", "recent": "a/reset", "visits": "", "has_map": False}]


class SessionTimeout(StatefulProcessor):
    """Registers a timer per row; reports each expiry in the order timers fire."""

    def init(self, handle) -> None:
        self.handle = handle

    def handle_input_rows(self, key, rows, timer_values):
        for ts in rows["ts"]:
            self.handle.registerTimer(int(ts) + 100)
        if key[0] == "cancelled":
            for ts in list(self.handle.listTimers()):
                self.handle.deleteTimer(ts)
        return iter(())

    def handle_expired_timer(self, key, timer_values, expired_timer_info):
        yield pd.DataFrame({"user": [key[0]], "expired_at": [expired_timer_info.getExpiryTimeInMs()],
                            "watermark": [timer_values.getCurrentWatermarkInMs()]})


def test_event_time_timers_fire_in_timestamp_order_when_the_watermark_passes(tmp_path: Path) -> None:
    op = ProcessorOperator("sessions", SessionTimeout, ["user"], "user STRING, expired_at BIGINT, watermark BIGINT",
                           time_mode="EventTime")
    rows = with_key_groups(pa.table({"user": ["zed", "amy", "amy", "cancelled", "bo"],
                                     "ts": [50, 300, 10, 0, 250]}), ["user"])
    assert run_epoch(tmp_path, op, rows, ctx(0, watermark_ms=0)).num_rows == 0
    out = run_epoch(tmp_path, op, pa.table({}), ctx(1, watermark_ms=350))
    assert [(r["user"], r["expired_at"]) for r in out.to_pylist()] == [("amy", 110), ("zed", 150), ("bo", 350)]
    assert set(out.column("watermark").to_pylist()) == {350}
    assert run_epoch(tmp_path, op, pa.table({}), ctx(2, watermark_ms=399)).num_rows == 0
    out = run_epoch(tmp_path, op, pa.table({}), ctx(3, watermark_ms=None, final=True))
    assert [(r["user"], r["expired_at"]) for r in out.to_pylist()] == [("amy", 400)]


def test_timers_need_a_time_mode(tmp_path: Path) -> None:
    op = ProcessorOperator("sessions", SessionTimeout, ["user"], "user STRING, expired_at BIGINT, watermark BIGINT")
    rows = with_key_groups(pa.table({"user": ["amy"], "ts": [1]}), ["user"])
    with pytest.raises(ConfigError, match="time_mode is 'none'"):
        run_epoch(tmp_path, op, rows, ctx(0))


class WrongOutput(StatefulProcessor):
    def handle_input_rows(self, key, rows, timer_values):
        yield pd.DataFrame({"user": [key[0]], "total": ["many"]})


def test_output_that_does_not_match_the_schema_names_the_processor(tmp_path: Path) -> None:
    op = ProcessorOperator("bad", WrongOutput, ["user"], "user STRING, n BIGINT")
    with pytest.raises(StateSchemaError, match=r"processor 'bad' produced columns \['user', 'total'\]"):
        run_epoch(tmp_path, op, clicks(("ann", "a")), ctx(0))
    op = ProcessorOperator("bad", WrongOutput, ["user"], "user STRING, total BIGINT")
    with pytest.raises(StateSchemaError, match="processor 'bad': output column 'total' does not fit int64"):
        run_epoch(tmp_path, op, clicks(("ann", "a")), ctx(0))


class WrongStateType(StatefulProcessor):
    def init(self, handle) -> None:
        self.total = handle.getValueState("total", "amount DOUBLE, label STRING")

    def handle_input_rows(self, key, rows, timer_values):
        self.total.update((1.0, 2))
        return iter(())


def test_writing_a_value_of_the_wrong_type_names_state_and_field(tmp_path: Path) -> None:
    op = ProcessorOperator("p", WrongStateType, ["user"], "user STRING")
    with pytest.raises(StateSchemaError, match="state 'total': field 'label'"):
        run_epoch(tmp_path, op, clicks(("ann", "a")), ctx(0))


class Reminder(StatefulProcessor):
    def init(self, handle) -> None:
        self.handle = handle

    def handle_input_rows(self, key, rows, timer_values):
        self.handle.registerTimer(timer_values.getCurrentProcessingTimeInMs() + 1_000)
        return iter(())

    def handle_expired_timer(self, key, timer_values, expired_timer_info):
        yield pd.DataFrame({"user": [key[0]], "at": [expired_timer_info.getExpiryTimeInMs()]})


def test_processing_time_timers_fire_when_processing_time_passes(tmp_path: Path) -> None:
    def make() -> ProcessorOperator:
        return ProcessorOperator("remind", Reminder, ["user"], "user STRING, at BIGINT", time_mode="processingtime")

    run_epoch(tmp_path, make(), clicks(("ann", "a")), ctx(0, processing_time_ms=5_000))
    run_epoch(tmp_path, make(), clicks(("bob", "a")), ctx(1, processing_time_ms=5_500))
    assert run_epoch(tmp_path, make(), pa.table({}), ctx(2, processing_time_ms=5_999)).num_rows == 0
    out = run_epoch(tmp_path, make(), pa.table({}), ctx(3, processing_time_ms=6_000))
    assert out.to_pylist() == [{"user": "ann", "at": 6_000}]


class ListLifecycle(StatefulProcessor):
    def init(self, handle) -> None:
        self.items = handle.getListState("items", "n INT, tag STRING")

    def handle_input_rows(self, key, rows, timer_values):
        steps = [self.items.exists()]
        self.items.appendList([(1, "a"), (2, None)])
        self.items.appendValue((3, "c"))
        steps.append(list(self.items.get()))
        self.items.put([])
        steps.append(self.items.exists())
        self.items.appendValue((4, "d"))
        self.items.put([(5, "e")])
        steps.append(list(self.items.get()))
        self.items.clear()
        steps.append(self.items.exists())
        yield pd.DataFrame({"user": [key[0]], "steps": [repr(steps)]})


def test_list_state_lifecycle_matches_pyspark(tmp_path: Path) -> None:
    op = ProcessorOperator("lists", ListLifecycle, ["user"], "user STRING, steps STRING")
    out = run_epoch(tmp_path, op, clicks(("ann", "a")), ctx(0))
    assert out.column("steps").to_pylist() == [repr([False, [(1, "a"), (2, None), (3, "c")], False, [(5, "e")], False])]


def test_a_processor_subclassing_pyspark_runs_unchanged(tmp_path: Path) -> None:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor as PySparkProcessor
    from pyspark.sql.types import LongType, StructField, StructType

    class Counter(PySparkProcessor):
        def init(self, handle) -> None:
            self.n = handle.getValueState("n", StructType([StructField("n", LongType())]))

        def handleInputRows(self, key, rows, timerValues):
            n = (self.n.get() or (0,))[0] + sum(len(pdf) for pdf in rows)
            self.n.update((n,))
            yield pd.DataFrame({"user": [key[0]], "n": [n]})

        def close(self) -> None:
            pass

    op = ProcessorOperator("counts", Counter, ["user"], "user STRING, n BIGINT")
    run_epoch(tmp_path, op, clicks(("ann", "a")), ctx(0))
    assert run_epoch(tmp_path, op, clicks(("ann", "b")), ctx(1)).to_pylist() == [{"user": "ann", "n": 2}]
