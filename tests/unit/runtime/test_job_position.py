"""The job's position (runtime/position.py): what an epoch moves, what a checkpoint's
`job` and `source:<name>` parts hold, and what a restore brings back, including from a
checkpoint written before graphs. No Spark: the graph is compiled, never run."""

from __future__ import annotations

from sparkpoint.api import KeyedAggregate
from sparkpoint.api.pipeline import Pipeline
from sparkpoint.connectors.base import SlicePlan
from sparkpoint.connectors.generator import GeneratorSource
from sparkpoint.connectors.parquet_sink import ParquetSink
from sparkpoint.runtime.graph import EventTimes, JobGraph
from sparkpoint.runtime.position import JobPosition, join_plans, split_plan
from sparkpoint.storage.metadata import canonical_json


def agg(name: str) -> KeyedAggregate:
    return KeyedAggregate(name, ["key"], "value", ("count",))


def two_steps() -> JobGraph:
    """orders (watermark 5 s) -> totals -> per_region -> sink; plus a source without event time."""
    p = Pipeline("pos")
    orders = p.read(GeneratorSource("g"), name="orders").watermark("ts", "5 s")
    plain = p.read(GeneratorSource("g"), name="plain")
    orders.union(plain).stateful(agg("totals")).stateful(agg("per_region")).sink(ParquetSink("out", name="out"))
    return JobGraph.of(p)


def position(graph: JobGraph | None = None) -> JobPosition:
    graph = graph or two_steps()
    return JobPosition([s.name for s in graph.sources], EventTimes(graph))


def initial(name: str) -> dict:
    return {f"{name}:0": 0}


def run_epoch(pos: JobPosition, ends: dict[str, int], records: int, max_ts: int | None, now_ms: int = 0,
              final: bool = False) -> dict:
    epoch = pos.next_epoch
    watermarks = pos.step_watermarks(["totals", "per_region"], now_ms, final)
    plans = {n: SlicePlan(dict(pos.source_positions[n]), {f"{n}:0": end}) for n, end in ends.items()}
    pos.advance(epoch, plans, records, {"orders": (records, max_ts)}, now_ms, watermarks, final)
    return watermarks


def test_an_epoch_moves_the_sources_the_event_times_and_the_counts():
    pos = position()
    pos.start_fresh(initial)
    assert pos.epoch == -1 and pos.source_positions == {"orders": {"orders:0": 0}, "plain": {"plain:0": 0}}
    assert run_epoch(pos, {"orders": 10, "plain": 4}, 14, 100_000) == {"totals": None, "per_region": None}
    assert pos.epoch == 0 and pos.source_positions == {"orders": {"orders:0": 10}, "plain": {"plain:0": 4}}
    assert pos.records == 14 and pos.max_event_time() == 100_000 and pos.watermark(0) == 95_000
    # The next epoch: totals runs under the orders' watermark, per_region one epoch behind it.
    assert run_epoch(pos, {"orders": 20, "plain": 4}, 10, 110_000) == {"totals": 95_000, "per_region": None}
    assert run_epoch(pos, {"orders": 20, "plain": 4}, 0, None) == {"totals": 105_000, "per_region": 95_000}
    assert pos.records == 24 and pos.replayed_records == 0


def test_the_final_epoch_runs_without_watermarks_and_leaves_the_steps_marks_alone():
    pos = position()
    pos.start_fresh(initial)
    run_epoch(pos, {"orders": 10}, 10, 100_000)
    run_epoch(pos, {"orders": 10}, 0, None)
    assert pos.step_watermarks(["totals"], 0, final=True) == {"totals": None}
    run_epoch(pos, {"orders": 10}, 0, None, final=True)
    assert pos.event_times.step_marks == {"totals": 95_000, "per_region": None}


def test_a_checkpoints_job_part_is_the_format_earlier_versions_wrote():
    pos = position()
    pos.start_fresh(initial)
    run_epoch(pos, {"orders": 10, "plain": 3}, 13, 100_000)
    run_epoch(pos, {"orders": 12, "plain": 3}, 2, 101_000)
    pos.origin, pos.origin_path = "orders/4@1700000000000", "/sp/savepoint-1"
    job = pos.to_checkpoint(now_ms=0, history="3f9c0a1b2c4d")
    expected = {"epoch": 1, "max_event_time": 101_000, "watermark": 96_000,
                "event_times": {"orders": 101_000}, "step_watermarks": {"totals": 95_000, "per_region": None},
                "records": 15, "origin": "orders/4@1700000000000", "history": "3f9c0a1b2c4d",
                "origin_path": "/sp/savepoint-1"}
    assert canonical_json(job) == canonical_json(expected)
    assert pos.source_handles() == {"orders": {"positions": {"orders:0": 12}},
                                    "plain": {"positions": {"plain:0": 3}}}


def test_a_restore_brings_back_what_the_checkpoint_holds_and_keeps_this_runs_counts():
    before = position()
    before.start_fresh(initial)
    for end in (10, 20, 30):
        run_epoch(before, {"orders": end, "plain": 1}, 10, end * 10_000)
    before.origin = "orders/4@1"
    job, sources = before.to_checkpoint(0, "h1"), before.source_handles()

    after = position()
    after.start_fresh(initial)
    for end in (10, 20, 30, 40):  # this run got further before it failed
        run_epoch(after, {"orders": end}, 10, end * 10_000)
    after.restore(job, sources, initial, "checkpoint 3")
    assert after.epoch == 2 and after.source_positions == before.source_positions
    assert after.event_times.max_event_time == before.event_times.max_event_time
    assert after.event_times.step_marks == before.event_times.step_marks
    assert (after.origin, after.origin_path) == ("orders/4@1", None)
    # The epochs re-run from here read their input again: counted as replayed, not twice.
    assert after.records == 40
    run_epoch(after, {"orders": 40}, 10, 400_000)
    run_epoch(after, {"orders": 50}, 10, 500_000)
    assert (after.records, after.replayed_records) == (50, 10)


def test_a_checkpoint_from_before_graphs_restores_its_one_watermark():
    """Earlier checkpoints hold only `max_event_time` (one stream), no per-stream or step marks."""
    p = Pipeline("old")
    p.read(GeneratorSource("g"), name="events").watermark("ts", "2 s").stateful(agg("totals")).sink(
        ParquetSink("out", name="out"))
    pos = position(JobGraph.of(p))
    pos.restore({"epoch": 7, "max_event_time": 50_000, "watermark": 48_000, "records": 80},
                {"events": {"positions": {"events:0": 80}}}, initial, "checkpoint 3")
    assert pos.epoch == 7 and pos.source_positions == {"events": {"events:0": 80}}
    assert pos.watermark(0) == 48_000 and pos.step_watermarks(["totals"], 0, False) == {"totals": 48_000}
    assert pos.origin is None and pos.origin_path is None


def test_a_source_the_checkpoint_does_not_have_starts_from_its_initial_positions():
    pos = position()
    pos.restore({"epoch": 3, "event_times": {"orders": 1}}, {"orders": {"positions": {"orders:0": 9}}, "plain": None},
                initial, "checkpoint 2")
    assert pos.source_positions == {"orders": {"orders:0": 9}, "plain": {"plain:0": 0}}


def test_plans_of_several_sources_join_into_one_logged_plan_and_split_back():
    plans = {"a": SlicePlan({"a:0": 1}, {"a:0": 5}), "b": SlicePlan({"b:0": 0}, {"b:0": 2})}
    joined = join_plans(plans)
    assert joined == SlicePlan({"a": {"a:0": 1}, "b": {"b:0": 0}}, {"a": {"a:0": 5}, "b": {"b:0": 2}})
    assert split_plan(joined, ["a", "b"]) == plans
    one = {"a": SlicePlan({"a:0": 1}, {"a:0": 5})}
    assert join_plans(one) == one["a"] and split_plan(one["a"], ["a"]) == one
