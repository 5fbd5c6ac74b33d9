"""The pipeline builder: a graph of named sources, plain PySpark steps, keyed stateful
steps (chained, or joining two streams) and one or more sinks.

    p = Pipeline("orders-revenue")
    orders = p.read(FileSource(...), name="orders").watermark("ts", "5 s")
    payments = p.read(KafkaSource(...), name="payments").transform(parse).watermark("paid_at", "5 s")
    revenue = orders.join(payments, join_operator).stateful(KeyedAggregate("revenue", ["customer"], ...))
    revenue.sink(ParquetSink("out/"))
    p.run()                                                     # or: sparkpoint run file.py

A `Stream` is an immutable value: every call returns a new one, and a step can only take
streams that already exist, so a graph can never contain a cycle. A stateful step's name
is its state's identity in checkpoints and savepoints (Flink's `uid`).

The linear shorthand builds one main stream on the pipeline itself:

    pipeline = (
        Pipeline("clicks-per-minute")
        .source(GeneratorSource(keys=10_000))
        .transform(lambda df: df.where("value >= 0"))          # plain PySpark
        .watermark("ts", delay="5 s")                           # event time
        .stateful(TumblingWindow("per_minute", ["key"], "ts", size="60 s"))
        .sink(ParquetSink("out/"))
    )
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pyarrow as pa

from sparkpoint.config import parse_duration_ms
from sparkpoint.connectors.base import Sink, Source
from sparkpoint.errors import ConfigError
from sparkpoint.state.interfaces import StatefulOperator


@dataclass(frozen=True)
class Watermark:
    column: str
    delay_ms: int
    idle_timeout_ms: int | None = None


# -- the graph's nodes ----------------------------------------------------------------------
# Nodes are created in order and only ever point at older nodes, so creation order is a
# topological order (`Pipeline.nodes()`).

_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class Node:
    parents: tuple["Node", ...]
    id: int = field(default_factory=lambda: next(_ids), init=False)

    def describe(self) -> str:
        return type(self).__name__


@dataclass(frozen=True, eq=False)
class SourceNode(Node):
    name: str = ""
    source: Source | None = None

    def describe(self) -> str:
        return f"source {self.name!r}"


@dataclass(frozen=True, eq=False)
class TransformNode(Node):
    fn: Callable[[Any], Any] | None = None


@dataclass(frozen=True, eq=False)
class WatermarkNode(Node):
    watermark: Watermark | None = None


@dataclass(frozen=True, eq=False)
class UnionNode(Node):
    pass


@dataclass(frozen=True, eq=False)
class StatefulNode(Node):
    """A keyed stateful step: one input, or two for an operator with `input_arity == 2`
    (a join: its `prepare_input(left, right)` makes one keyed input of both)."""
    operator: StatefulOperator | None = None

    @property
    def name(self) -> str:
        return self.operator.name

    def describe(self) -> str:
        return f"step {self.name!r}"


@dataclass(frozen=True, eq=False)
class MapOutputNode(Node):
    fn: Callable[[pa.Table], pa.Table] | None = None


@dataclass(frozen=True, eq=False)
class SinkNode(Node):
    sink: Sink | None = None

    @property
    def name(self) -> str:
        return self.sink.name

    def describe(self) -> str:
        return f"sink {self.name!r}"


def arity(operator: Any) -> int:
    return int(getattr(operator, "input_arity", 1) or 1)


# -- streams --------------------------------------------------------------------------------

class Stream:
    """The rows flowing out of one step. Immutable: each method returns a new Stream
    (or, for `sink`, registers the sink and returns this stream, so a stream can fan out)."""

    __slots__ = ("pipeline", "node")

    def __init__(self, pipeline: "Pipeline", node: Node):
        self.pipeline = pipeline
        self.node = node

    def _then(self, node: Node) -> "Stream":
        return Stream(self.pipeline, self.pipeline._add(node))

    def transform(self, fn: Callable[[Any], Any]) -> "Stream":
        """A stateless step: DataFrame -> DataFrame, run in Spark every epoch."""
        if not callable(fn):
            raise ConfigError(f"transform() takes a function DataFrame -> DataFrame, got {type(fn).__name__}")
        return self._then(TransformNode((self.node,), fn=fn))

    def watermark(self, column: str, delay: str | int, idle_timeout: str | int | None = None) -> "Stream":
        """Event time is `column`: a TIMESTAMP / TIMESTAMP_NTZ column or epoch ms in an
        integer column. The watermark trails the largest event time seen by `delay` (like
        Spark's withWatermark / Flink's bounded out-of-orderness). `idle_timeout`: once this
        stream has brought no rows for that long, steps downstream stop waiting for it (their
        watermark is the minimum over their other inputs), as Flink's withIdleness."""
        idle = parse_duration_ms(idle_timeout) if idle_timeout is not None else None
        return self._then(WatermarkNode((self.node,), watermark=Watermark(column, parse_duration_ms(delay), idle)))

    def stateful(self, operator: StatefulOperator) -> "Stream":
        """A keyed stateful step (KeyedAggregate, TumblingWindow, a ProcessorOperator...);
        its output is a new stream. Steps chain: `.stateful(a).stateful(b)`."""
        _check_operator(operator)
        if arity(operator) != 1:
            raise ConfigError(f"step {operator.name!r} takes two inputs: write left.join(right, operator)")
        return self._then(StatefulNode((self.node,), operator=operator))

    def join(self, other: "Stream", operator: StatefulOperator) -> "Stream":
        """A keyed step over two streams (this one left, `other` right), such as an interval
        or window join; its output is a new stream."""
        _check_operator(operator)
        self._same_pipeline(other, "join")
        if arity(operator) != 2:
            raise ConfigError(f"step {operator.name!r} takes one input: write stream.stateful(operator), "
                              f"not join()")
        return self._then(StatefulNode((self.node, other.node), operator=operator))

    def union(self, *others: "Stream") -> "Stream":
        """The rows of this stream and of `others`, matched by column name (unionByName)."""
        if not others:
            return self
        for o in others:
            self._same_pipeline(o, "union")
        return self._then(UnionNode((self.node, *(o.node for o in others))))

    def map_output(self, fn: Callable[[pa.Table], pa.Table]) -> "Stream":
        """A step on each epoch's rows as an Arrow table (typically a stateful step's output)."""
        if not callable(fn):
            raise ConfigError(f"map_output() takes a function pyarrow.Table -> pyarrow.Table, got {type(fn).__name__}")
        return self._then(MapOutputNode((self.node,), fn=fn))

    def sink(self, sink: Sink) -> "Stream":
        """Write this stream to `sink` (ParquetSink, DeltaSink, KafkaSink), exactly-once.
        Returns this stream: a stream may go to several sinks."""
        if not isinstance(sink, Sink):
            raise ConfigError(f"sink() takes a Sink (ParquetSink, DeltaSink, KafkaSink...), got {type(sink).__name__}")
        self.pipeline._add(SinkNode((self.node,), sink=sink))
        return self

    def _same_pipeline(self, other: Any, what: str) -> None:
        if not isinstance(other, Stream):
            raise ConfigError(f"{what}() takes a Stream, got {type(other).__name__}")
        if other.pipeline is not self.pipeline:
            raise ConfigError(f"{what}() of streams of two different pipelines "
                              f"({self.pipeline.name!r} and {other.pipeline.name!r}): read both in one Pipeline")

    def __repr__(self) -> str:
        return f"Stream({self.node.describe()})"


def _check_source(source: Any) -> None:
    if not isinstance(source, Source):
        raise ConfigError(f"a pipeline reads a Source (FileSource, KafkaSource, GeneratorSource...), "
                          f"got {type(source).__name__}")


def _check_operator(operator: Any) -> None:
    if not isinstance(operator, StatefulOperator):
        raise ConfigError(f"a stateful step takes a StatefulOperator (KeyedAggregate, TumblingWindow, "
                          f"ProcessorOperator...), got {type(operator).__name__}")


# -- the pipeline ---------------------------------------------------------------------------

class _Segment:
    """A stretch of the linear shorthand's main stream: stateless steps, a watermark and
    output maps, then (unless it is the last) the stateful step that ends it."""

    def __init__(self) -> None:
        self.transforms: list[Callable[[Any], Any]] = []
        self.watermark: Watermark | None = None
        self.maps: list[Callable[[pa.Table], pa.Table]] = []
        self.operator: StatefulOperator | None = None


class Pipeline:
    """A streaming job: named sources (`read`), the streams built from them, and their
    sinks; or, with the linear shorthand, one main stream (`source(...).stateful(...).sink(...)`).
    `run()` runs it; `validate()` checks the graph without starting anything."""

    def __init__(self, name: str | None = None):
        self.name = name
        self._nodes: list[Node] = []
        # The linear shorthand (`.source(..).transform(..).stateful(..).sink(..)`) is kept
        # as written and turned into nodes when the graph is asked for, so calls keep the
        # meaning they always had whatever their order: within a segment the stateless
        # steps run first, then the watermark is taken, then output maps; sinks take the
        # main stream's end.
        self._linear_source: Source | None = None
        self._segments: list[_Segment] = [_Segment()]
        self._linear_sinks: list[Sink] = []
        self._built: tuple[int, list[Node]] | None = None
        self._version = 0

    # -- graph building ---------------------------------------------------------------------
    def read(self, source: Source, name: str | None = None) -> Stream:
        """A named input stream. `name` (default: the source's own) is its identity in
        checkpoints: its positions are restored by it."""
        _check_source(source)
        if name is not None and name != source.name:
            source.name = name
        return Stream(self, self._add(SourceNode((), name=source.name, source=source)))

    def _add(self, node: Node) -> Node:
        self._nodes.append(node)
        return node

    def nodes(self) -> list[Node]:
        """Every node, in a topological order (each after its inputs)."""
        if self._linear_source is None and len(self._segments) == 1 and not self._linear_sinks:
            return list(self._nodes)
        if self._built is None or self._built[0] != self._version:
            self._built = (self._version, self._linear_nodes())
        return list(self._nodes) + self._built[1]

    def _linear_nodes(self) -> list[Node]:
        if self._linear_source is None:
            raise ConfigError("the pipeline has no source: call .source(...) before .transform(), .stateful() "
                              "or .sink()")
        out: list[Node] = []

        def add(node: Node) -> Node:
            out.append(node)
            return node

        node = add(SourceNode((), name=self._linear_source.name, source=self._linear_source))
        for seg in self._segments:
            for fn in seg.transforms:
                node = add(TransformNode((node,), fn=fn))
            if seg.watermark is not None:
                node = add(WatermarkNode((node,), watermark=seg.watermark))
            for fn in seg.maps:
                node = add(MapOutputNode((node,), fn=fn))
            if seg.operator is not None:
                node = add(StatefulNode((node,), operator=seg.operator))
        for sink in self._linear_sinks:
            add(SinkNode((node,), sink=sink))
        return out

    def _changed(self) -> "Pipeline":
        self._version += 1
        return self

    # -- the linear shorthand ----------------------------------------------------------------
    def source(self, source: Source) -> "Pipeline":
        """The input of the main stream: a GeneratorSource, FileSource or KafkaSource."""
        _check_source(source)
        self._linear_source = source
        return self._changed()

    def transform(self, fn: Callable[[Any], Any]) -> "Pipeline":
        """A stateless step: DataFrame -> DataFrame, run in Spark every epoch (after a
        stateful step: on that step's output)."""
        if not callable(fn):
            raise ConfigError(f"transform() takes a function DataFrame -> DataFrame, got {type(fn).__name__}")
        self._segments[-1].transforms.append(fn)
        return self._changed()

    def watermark(self, column: str, delay: str | int, idle_timeout: str | int | None = None) -> "Pipeline":
        """Event time of the main stream (see Stream.watermark); taken on the rows the
        next stateful step (or the sink) gets."""
        idle = parse_duration_ms(idle_timeout) if idle_timeout is not None else None
        self._segments[-1].watermark = Watermark(column, parse_duration_ms(delay), idle)
        return self._changed()

    def stateful(self, operator: StatefulOperator) -> "Pipeline":
        """A keyed stateful step on the main stream; call it again to chain another."""
        _check_operator(operator)
        if arity(operator) != 1:
            raise ConfigError(f"step {operator.name!r} takes two inputs: build the graph with "
                              f"pipeline.read(...) streams and left.join(right, operator)")
        self._segments[-1].operator = operator
        self._segments.append(_Segment())
        return self._changed()

    def map_output(self, fn: Callable[[pa.Table], pa.Table]) -> "Pipeline":
        """A step on each epoch's output (an Arrow table): the last stateful step's, before
        the sink."""
        if not callable(fn):
            raise ConfigError(f"map_output() takes a function pyarrow.Table -> pyarrow.Table, got {type(fn).__name__}")
        self._segments[-1].maps.append(fn)
        return self._changed()

    def sink(self, sink: Sink) -> "Pipeline":
        """Write the main stream to `sink`, exactly-once (call again to fan out)."""
        if not isinstance(sink, Sink):
            raise ConfigError(f"sink() takes a Sink (ParquetSink, DeltaSink, KafkaSink...), got {type(sink).__name__}")
        self._linear_sinks.append(sink)
        return self._changed()

    # -- views the runtime and tools use ---------------------------------------------------------
    def sources(self) -> list[SourceNode]:
        """The source nodes, in the order they were read."""
        return [n for n in self.nodes() if isinstance(n, SourceNode)]

    def steps(self) -> list[StatefulNode]:
        """The stateful steps, each after the steps it reads from."""
        return [n for n in self.nodes() if isinstance(n, StatefulNode)]

    def sinks(self) -> list[SinkNode]:
        """The sink nodes, in the order they were added."""
        return [n for n in self.nodes() if isinstance(n, SinkNode)]

    @property
    def source_(self) -> Source | None:
        """The first source (the only one of a linear pipeline)."""
        found = self.sources()
        return found[0].source if found else None

    @property
    def sink_(self) -> Sink | None:
        """The first sink (the only one of a linear pipeline)."""
        found = self.sinks()
        return found[0].sink if found else None

    @property
    def stateful_(self) -> StatefulOperator | None:
        """The stateful step of a pipeline that has exactly one (else None)."""
        found = self.steps()
        return found[0].operator if len(found) == 1 else None

    @property
    def watermark_(self) -> Watermark | None:
        """The watermark of a pipeline that declares one (the first, in graph order)."""
        if self._linear_source is None and len(self._segments) == 1 and not self._linear_sinks:
            found = [n.watermark for n in self._nodes if isinstance(n, WatermarkNode)]
        else:
            found = [n.watermark for n in self._nodes if isinstance(n, WatermarkNode)] + \
                    [seg.watermark for seg in self._segments if seg.watermark is not None]
        return found[0] if found else None

    # -- validation ------------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise one ConfigError naming the step if the graph cannot run: no source, no sink,
        a stateful step or source that reaches no sink, two steps with one name, a step that
        needs event time on an input without a watermark."""
        if self._linear_source is None and (len(self._segments) > 1 or self._segments[0].transforms
                                            or self._linear_sinks):
            raise ConfigError("the pipeline has no source: call .source(...) or .read(...)")
        if not self.sources():
            raise ConfigError("the pipeline has no source: call .source(...) or .read(...)")
        if not self.sinks():
            raise ConfigError("the pipeline has no sink: call .sink(...)")
        _unique("source", [n.name for n in self.sources()])
        _unique("step", [n.name for n in self.steps()],
                why="a step's name is its state's identity in checkpoints")
        _unique("sink", [n.name for n in self.sinks()])
        used = upstream_of(self.sinks())
        # A step first: it is the more specific answer when both a step and its source dangle.
        for node in [*self.steps(), *self.sources()]:
            if node not in used:
                raise ConfigError(f"{node.describe()} reaches no sink: add .sink(...) to its stream "
                                  f"(or to a stream that reads from it)")
        for node in self.steps():
            if not getattr(node.operator, "requires_event_time", False):
                continue
            sides = ("left", "right") if len(node.parents) == 2 else ("",)
            for side, parent in zip(sides, node.parents):
                missing = sources_without_watermark(parent)
                if missing:
                    where = f"its {side} input" if side else "its input"
                    raise ConfigError(
                        f"{node.describe()} needs event time, but {where} has no watermark: call "
                        f".watermark(column, delay) on the stream read from {', '.join(repr(m) for m in missing)}")

    def run(self, config: str | None = None, sets: list[str] | None = None, *, spark: Any = None, **overrides: Any):
        """Run until the sources are exhausted or the job is cancelled: `sparkpoint.run(self, ...)`.
        `spark`: the SparkSession to run in (default: the active one, else one sparkpoint
        creates); it keeps its settings and is not stopped. Keyword overrides use python
        names or Flink keys via a dict: run(overrides={"parallelism.default": 4})."""
        if _launcher is None:
            raise RuntimeError("no job launcher installed: import sparkpoint (its __init__ installs "
                               "sparkpoint.job.run)")
        return _launcher(self, config, sets, spark=spark, **overrides)


def _unique(kind: str, names: list[str], why: str = "") -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            reason = f" ({why})" if why else ""
            raise ConfigError(f"two {kind}s are named {name!r}{reason}: give each its own name")
        seen.add(name)


def upstream_of(nodes: Iterable[Node]) -> set[Node]:
    """`nodes` and every node they read from, directly or not."""
    seen: set[Node] = set()
    todo = list(nodes)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(n.parents)
    return seen


def sources_without_watermark(node: Node) -> list[str]:
    """The names of the sources whose rows reach `node` without passing a watermark."""
    if isinstance(node, WatermarkNode):
        return []
    if isinstance(node, SourceNode):
        return [node.name]
    found: list[str] = []
    for p in node.parents:
        found += [s for s in sources_without_watermark(p) if s not in found]
    return found


# The builder knows nothing of the runtime (pyproject.toml's import contracts forbid
# api -> runtime), so `Pipeline.run` goes through this hook: sparkpoint/__init__.py installs
# `sparkpoint.job.run`, and Python runs that file before any sparkpoint.* module is imported.
_launcher: Callable[..., Any] | None = None


def set_launcher(launch: Callable[..., Any]) -> None:
    global _launcher
    _launcher = launch
