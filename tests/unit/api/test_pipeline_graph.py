"""The pipeline builder as a graph: streams, chaining, unions, joins, fan-out, and the
one-line refusals of graphs that cannot run (checked before Spark starts)."""

from __future__ import annotations

import pytest

from sparkpoint.api import KeyedAggregate, TumblingWindow
from sparkpoint.api.pipeline import (MapOutputNode, Pipeline, SinkNode, SourceNode, StatefulNode, TransformNode,
                                     UnionNode, WatermarkNode)
from sparkpoint.connectors.generator import GeneratorSource
from sparkpoint.connectors.parquet_sink import ParquetSink
from sparkpoint.errors import ConfigError
from tests.graph_support import InnerJoin


def agg(name: str) -> KeyedAggregate:
    return KeyedAggregate(name, ["key"], {"n": ("count", None)})


def kinds(p: Pipeline) -> list[str]:
    return [type(n).__name__ for n in p.nodes()]


def test_the_linear_shorthand_builds_the_chain_it_always_meant(tmp_path):
    def drop(df):
        return df

    p = (Pipeline("lin").source(GeneratorSource("g")).transform(drop).watermark("ts", "5 s")
         .stateful(agg("totals")).sink(ParquetSink(str(tmp_path))).map_output(lambda t: t))
    p.validate()
    assert kinds(p) == ["SourceNode", "TransformNode", "WatermarkNode", "StatefulNode", "MapOutputNode", "SinkNode"]
    assert p.stateful_.name == "totals" and p.watermark_.delay_ms == 5000 and p.source_.name == "g"
    assert isinstance(p.sink_, ParquetSink)


def test_the_linear_shorthand_chains_stateful_steps_with_plain_steps_between():
    p = (Pipeline("two").source(GeneratorSource("g")).stateful(agg("a")).transform(lambda df: df)
         .stateful(agg("b")).sink(ParquetSink("out", name="out")))
    p.validate()
    assert kinds(p) == ["SourceNode", "StatefulNode", "TransformNode", "StatefulNode", "SinkNode"]
    a, b = p.steps()
    assert b.parents[0].parents[0] is a  # b reads a's output through the plain step
    assert p.stateful_ is None  # two steps: no single stateful step to hand to tools


def test_streams_are_values_each_call_returns_a_new_stream():
    p = Pipeline("v")
    s = p.read(GeneratorSource("g"))
    t = s.transform(lambda df: df)
    assert t is not s and s.node is not t.node and isinstance(s.node, SourceNode)
    assert isinstance(t.node, TransformNode) and t.node.parents == (s.node,)


def test_a_graph_with_two_sources_a_union_a_join_chained_steps_and_two_sinks_validates():
    p = Pipeline("graph")
    a = p.read(GeneratorSource("g"), name="orders").watermark("ts", "5 s")
    b = p.read(GeneratorSource("g"), name="more_orders").watermark("ts", "5 s", idle_timeout="30 s")
    pay = p.read(GeneratorSource("g"), name="payments").watermark("ts", "1 s")
    both = a.union(b)
    matched = both.join(pay, InnerJoin("matched", "key", ["value"], ["offset"], requires_event_time=True))
    revenue = matched.stateful(agg("revenue"))
    revenue.transform(lambda df: df).stateful(agg("per_minute")).sink(ParquetSink("out", name="out"))
    revenue.map_output(lambda t: t).sink(ParquetSink("side", name="side"))
    p.validate()
    assert [s.name for s in p.sources()] == ["orders", "more_orders", "payments"]
    assert [s.name for s in p.steps()] == ["matched", "revenue", "per_minute"]
    assert [s.name for s in p.sinks()] == ["out", "side"]
    assert isinstance(both.node, UnionNode) and len(both.node.parents) == 2
    assert b.node.watermark.idle_timeout_ms == 30_000
    order = {n: i for i, n in enumerate(p.nodes())}
    assert all(order[parent] < order[n] for n in p.nodes() for parent in n.parents), "nodes in topological order"


@pytest.mark.parametrize("build, line", [
    (lambda p, t: None, "the pipeline has no source: call .source(...) or .read(...)"),
    (lambda p, t: p.read(GeneratorSource("g")).stateful(agg("a")), "the pipeline has no sink: call .sink(...)"),
    (lambda p, t: (p.read(GeneratorSource("g")).stateful(agg("a")).stateful(agg("a"))
                   .sink(ParquetSink(t))),
     "two steps are named 'a' (a step's name is its state's identity in checkpoints): give each its own name"),
    (lambda p, t: (p.read(GeneratorSource("g")).sink(ParquetSink(t, name="x")),
                   p.read(GeneratorSource("g"), name="h").stateful(agg("lonely"))),
     "step 'lonely' reaches no sink: add .sink(...) to its stream (or to a stream that reads from it)"),
    (lambda p, t: (p.read(GeneratorSource("g")).sink(ParquetSink(t, name="x")),
                   p.read(GeneratorSource("g"), name="h")),
     "source 'h' reaches no sink: add .sink(...) to its stream (or to a stream that reads from it)"),
    (lambda p, t: p.read(GeneratorSource("g"), name="orders").watermark("ts", "1 s").join(
        p.read(GeneratorSource("g"), name="payments").transform(lambda df: df),
        InnerJoin("matched", "key", ["value"], ["offset"], requires_event_time=True)).sink(ParquetSink(t)),
     "step 'matched' needs event time, but its right input has no watermark: call .watermark(column, delay) on "
     "the stream read from 'payments'"),
    (lambda p, t: (p.read(GeneratorSource("g")).sink(ParquetSink(t)), p.read(GeneratorSource("h"))
                   .sink(ParquetSink(t))),
     "two sinks are named 'parquet': give each its own name"),
])
def test_a_bad_graph_fails_at_start_with_one_line_naming_the_step(tmp_path, build, line):
    p = Pipeline("bad")
    build(p, str(tmp_path))
    with pytest.raises(ConfigError) as e:
        p.validate()
    assert str(e.value) == line


def test_a_join_operator_is_refused_by_stateful_and_a_one_input_operator_by_join():
    p = Pipeline("j")
    s = p.read(GeneratorSource("g"))
    with pytest.raises(ConfigError, match="step 'm' takes two inputs: write left.join"):
        s.stateful(InnerJoin("m", "key", ["value"], ["offset"]))
    with pytest.raises(ConfigError, match="step 'a' takes one input"):
        s.join(s, agg("a"))


def test_streams_of_two_pipelines_do_not_mix():
    a = Pipeline("a").read(GeneratorSource("g"))
    b = Pipeline("b").read(GeneratorSource("h"))
    with pytest.raises(ConfigError, match="union\\(\\) of streams of two different pipelines"):
        a.union(b)


def test_a_window_after_a_join_without_watermarks_names_both_sources():
    p = Pipeline("w")
    left = p.read(GeneratorSource("g"), name="l")
    right = p.read(GeneratorSource("g"), name="r")
    window = TumblingWindow("w", ["key"], "ts", size="60 s")
    window.requires_event_time = True
    left.union(right).stateful(window).sink(ParquetSink("o"))
    with pytest.raises(ConfigError, match="^step 'w' needs event time, but its input has no watermark: call "
                                          r"\.watermark\(column, delay\) on the stream read from 'l', 'r'$"):
        p.validate()
    assert isinstance(p.nodes()[-1], SinkNode) and isinstance(p.nodes()[2], UnionNode)
    assert not any(isinstance(n, (WatermarkNode, MapOutputNode)) for n in p.nodes())
    assert isinstance(p.steps()[0], StatefulNode)
