"""Each step's watermark in a graph: the minimum over the watermarks upstream of it, an
idle input left out after its idle timeout, and restored from a checkpoint per stream.
Times are given by the test (no clock, no Spark)."""

from __future__ import annotations

from sparkpoint.api import KeyedAggregate
from sparkpoint.api.pipeline import Pipeline
from sparkpoint.connectors.generator import GeneratorSource
from sparkpoint.connectors.parquet_sink import ParquetSink
from sparkpoint.runtime.graph import EventTimes, JobGraph
from tests.graph_support import InnerJoin


def agg(name: str) -> KeyedAggregate:
    return KeyedAggregate(name, ["key"], "value", ("count",))


def two_inputs() -> JobGraph:
    p = Pipeline("wm")
    orders = p.read(GeneratorSource("g"), name="orders").watermark("ts", "5 s")
    payments = p.read(GeneratorSource("g"), name="payments").watermark("ts", "1 s", idle_timeout="30 s")
    plain = p.read(GeneratorSource("g"), name="plain")
    joined = orders.join(payments, InnerJoin("matched", "key", ["value"], ["offset"]))
    joined.stateful(agg("per_customer")).sink(ParquetSink("a", name="a"))
    orders.union(plain).stateful(agg("orders_only")).sink(ParquetSink("b", name="b"))
    return JobGraph.of(p)


def test_a_step_after_a_join_takes_the_minimum_of_both_inputs_watermarks():
    graph = two_inputs()
    assert graph.step_watermarks == {"matched": ["orders", "payments"], "per_customer": [],
                                     "orders_only": ["orders"]}
    assert graph.step_upstreams == {"matched": [], "per_customer": ["matched"], "orders_only": []}
    times = EventTimes(graph)
    times.observe("orders", 10, 100_000, now_ms=0)
    assert times.for_step("matched", 0) is None, "an input without a watermark yet holds the step back"
    assert times.for_step("orders_only", 0) == 95_000, "a stream without a watermark does not hold a step back"
    times.observe("payments", 10, 50_000, now_ms=0)
    assert times.for_step("matched", 0) == 49_000
    assert times.job_watermark(0) == 49_000


def test_a_step_after_a_stateful_step_runs_one_epoch_behind_it_in_event_time():
    """The rows `matched` emits under watermark W reach `per_customer` while its watermark
    is still the one `matched` ran under the epoch before (Flink forwards a watermark after
    the rows it fired): they are on time there."""
    times = EventTimes(two_inputs())
    times.observe("orders", 10, 100_000, now_ms=0)
    times.observe("payments", 10, 50_000, now_ms=0)
    assert times.for_step("per_customer", 0) is None, "matched has not run yet"
    times.ran("matched", times.for_step("matched", 0))
    assert times.for_step("per_customer", 0) == 49_000, "a step's output carries its watermark on, one epoch later"
    times.observe("payments", 10, 90_000, now_ms=1)
    assert times.for_step("matched", 1) == 89_000
    assert times.for_step("per_customer", 1) == 49_000
    times.ran("matched", 89_000)
    times.reset({"orders": 100_000, "payments": 90_000}, {"matched": 89_000, "gone": 5})
    assert times.step_marks == {"matched": 89_000, "per_customer": None, "orders_only": None}
    assert times.for_step("per_customer", 0) == 89_000, "restored from the checkpoint"


def test_an_input_idle_past_its_timeout_stops_holding_the_watermark_back_until_it_sends_again():
    times = EventTimes(two_inputs())
    times.observe("orders", 10, 100_000, now_ms=0)
    times.observe("payments", 10, 50_000, now_ms=0)
    times.observe("orders", 10, 200_000, now_ms=20_000)
    times.observe("payments", 0, None, now_ms=20_000)
    assert times.for_step("matched", 20_000) == 49_000, "idle for 20 s: within its 30 s timeout"
    times.observe("orders", 10, 300_000, now_ms=31_000)
    times.observe("payments", 0, None, now_ms=31_000)
    assert times.for_step("matched", 31_000) == 295_000, "idle for 31 s: left out"
    times.observe("payments", 1, 60_000, now_ms=32_000)
    assert times.for_step("matched", 32_000) == 59_000, "it sends again: it counts again"


def test_when_every_input_is_idle_the_largest_watermark_holds():
    p = Pipeline("idle")
    a = p.read(GeneratorSource("g"), name="a").watermark("ts", "0 s", idle_timeout="1 s")
    b = p.read(GeneratorSource("g"), name="b").watermark("ts", "0 s", idle_timeout="1 s")
    a.union(b).stateful(agg("s")).sink(ParquetSink("o"))
    times = EventTimes(JobGraph.of(p))
    times.observe("a", 1, 10, now_ms=0)
    times.observe("b", 1, 20, now_ms=0)
    assert times.for_step("s", 500) == 10
    assert times.for_step("s", 5_000) == 20


def test_restored_event_times_are_per_stream_and_every_stream_starts_active():
    times = EventTimes(two_inputs())
    times.observe("payments", 0, None, now_ms=0)
    times.reset({"orders": 100_000, "payments": 40_000, "gone": 7})
    assert times.max_event_time == {"orders": 100_000, "payments": 40_000}
    assert times.for_step("matched", 10**9) == 39_000, "after a restore no stream counts as idle yet"


def test_a_step_stages_on_the_executors_only_when_a_sink_is_all_that_reads_it():
    p = Pipeline("paths")
    src = p.read(GeneratorSource("g"))
    alone = src.stateful(agg("alone")).map_output(lambda t: t)
    alone.sink(ParquetSink("a", name="a"))
    shared = src.stateful(agg("shared"))
    shared.sink(ParquetSink("b", name="b"))
    shared.stateful(agg("after")).sink(ParquetSink("c", name="c"))
    fanned = src.map_output(lambda t: t)
    fanned.sink(ParquetSink("d", name="d"))
    fanned.sink(ParquetSink("e", name="e"))
    graph = JobGraph.of(p)
    assert {step: sink.name for step, sink in graph.staged.items()} == {"alone": "a", "after": "c"}
    assert alone.node in graph.folded_maps and len(graph.sink_inputs[graph.staged["alone"]].maps) == 1
    assert fanned.node not in graph.folded_maps, "a map two sinks read runs once, before both"
    assert {graph.sink_inputs[s].base for s in graph.sinks if s.name in ("d", "e")} == {fanned.node}
