"""The pipeline's graph as the driver runs it (no Spark here).

`JobGraph` compiles `Pipeline.nodes()` once: the nodes every sink needs, in topological
order; for each stateful step the sink its output can be staged to on the executors
(its only consumer, through output maps), and the watermarks upstream of it; for each
sink the node its rows come from and the output maps on the way.

`EventTimes` keeps each watermark's largest event time seen and when its stream last
brought rows, and gives each step its watermark: the minimum over its inputs, leaving out
a stream idle for longer than its `idle_timeout` (Flink's idleness); when every one is
idle, the largest. Streams without a watermark do not hold a step back (Spark's rule: the
minimum is over the inputs that declare event time).

An input that comes out of another stateful step counts with the watermark that step ran
under in the previous epoch, not in this one: each stateful hop runs one epoch behind in
event time. In Flink an operator emits what a watermark fires before it forwards that
watermark, so the rows a window fires at W reach the next operator while its watermark is
still below W. Here every step of an epoch runs under a watermark fixed before the epoch;
giving the next step the same W would make it drop those rows as late (and clean up their
join partners). The watermarks steps ran under are checkpointed with the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from sparkpoint.api.pipeline import (MapOutputNode, Node, Pipeline, SinkNode, SourceNode, StatefulNode,
                                     WatermarkNode, upstream_of)


@dataclass
class SinkInput:
    """Where a sink's rows come from: `base` (a DataFrame or a step's Arrow output) through `maps`."""
    base: Node
    maps: tuple[Callable, ...]


@dataclass
class JobGraph:
    order: list[Node]
    consumers: dict[Node, list[Node]]
    sources: list[SourceNode]
    steps: list[StatefulNode]
    sinks: list[SinkNode]
    watermark_keys: dict[WatermarkNode, str]
    step_watermarks: dict[str, list[str]]  # step name -> watermark keys upstream of it, no step between
    step_upstreams: dict[str, list[str]]  # step name -> the nearest stateful steps upstream of it
    staged: dict[str, SinkNode] = field(default_factory=dict)  # step name -> the sink its output stages to
    sink_inputs: dict[SinkNode, SinkInput] = field(default_factory=dict)
    folded_maps: set[Node] = field(default_factory=set)  # output maps a sink applies itself

    @classmethod
    def of(cls, pipeline: Pipeline) -> "JobGraph":
        sinks = pipeline.sinks()
        used = upstream_of(sinks)
        order = [n for n in pipeline.nodes() if n in used]
        consumers: dict[Node, list[Node]] = {n: [] for n in order}
        for n in order:
            for p in n.parents:
                consumers[p].append(n)
        keys: dict[WatermarkNode, str] = {}
        for n in order:
            if isinstance(n, WatermarkNode):
                base = "+".join(s.name for s in order if isinstance(s, SourceNode) and s in upstream_of([n]))
                key, i = base, 1
                while key in keys.values():
                    i += 1
                    key = f"{base}#{i}"
                keys[n] = key
        steps = [n for n in order if isinstance(n, StatefulNode)]
        graph = cls(order, consumers, [n for n in order if isinstance(n, SourceNode)], steps, sinks, keys,
                    {s.name: _nearest_watermarks(s, keys) for s in steps},
                    {s.name: _nearest_steps(s) for s in steps})
        for sink in sinks:
            base, maps = sink.parents[0], []
            while isinstance(base, MapOutputNode) and len(consumers[base]) == 1:
                maps.insert(0, base.fn)
                graph.folded_maps.add(base)
                base = base.parents[0]
            graph.sink_inputs[sink] = SinkInput(base, tuple(maps))
            if isinstance(base, StatefulNode) and _only_path(base, sink, consumers):
                graph.staged[base.name] = sink
        return graph

    def single_consumer(self, node: Node) -> Node | None:
        found = self.consumers.get(node) or []
        return found[0] if len(found) == 1 else None

    def watermark_feeds_step(self, node: WatermarkNode) -> StatefulNode | None:
        """The one-input step that is this watermark's only consumer: its Spark job then
        carries the max event time and the row count (no observation of its own)."""
        nxt = self.single_consumer(node)
        return nxt if isinstance(nxt, StatefulNode) and len(nxt.parents) == 1 else None

    def source_feeds_step(self, node: SourceNode) -> StatefulNode | None:
        """The one-input step a source's rows reach unchanged (at most through a watermark):
        that step's input count is the source's record count."""
        nxt = self.single_consumer(node)
        if isinstance(nxt, WatermarkNode):
            nxt = self.watermark_feeds_step(nxt)
        return nxt if isinstance(nxt, StatefulNode) and len(nxt.parents) == 1 else None


def _nearest_watermarks(node: Node, keys: Mapping[WatermarkNode, str]) -> list[str]:
    return sorted({keys[n] for n in _nearest(node) if isinstance(n, WatermarkNode)})


def _nearest_steps(node: Node) -> list[str]:
    return sorted({n.name for n in _nearest(node) if isinstance(n, StatefulNode)})


def _nearest(node: Node) -> list[Node]:
    """The watermarks and stateful steps upstream of `node` with none of either between."""
    found: list[Node] = []
    todo, seen = list(node.parents), set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if isinstance(n, (WatermarkNode, StatefulNode)):
            found.append(n)
            continue
        todo.extend(n.parents)
    return found


def _only_path(step: StatefulNode, sink: SinkNode, consumers: Mapping[Node, list[Node]]) -> bool:
    node: Node = step
    while node is not sink:
        nxt = consumers[node]
        if len(nxt) != 1:
            return False
        node = nxt[0]
    return True


class EventTimes:
    """Per watermark: the largest event time seen (checkpointed) and when its stream last
    brought rows (this run only: after a restore every stream counts as active again,
    as Flink's sources start active). Per step: the watermark it last ran under
    (checkpointed), which the steps after it take one epoch later."""

    def __init__(self, graph: JobGraph):
        self.delay = {k: n.watermark.delay_ms for n, k in graph.watermark_keys.items()}
        self.idle_timeout = {k: n.watermark.idle_timeout_ms for n, k in graph.watermark_keys.items()}
        self.step_inputs = graph.step_watermarks
        self.step_upstreams = graph.step_upstreams
        self.max_event_time: dict[str, int | None] = {k: None for k in self.delay}
        self.active_since: dict[str, int | None] = {k: None for k in self.delay}
        self.step_marks: dict[str, int | None] = {s: None for s in graph.step_upstreams}

    def reset(self, restored: Mapping[str, Any] | None = None,
              step_marks: Mapping[str, Any] | None = None) -> None:
        self.max_event_time = {k: None for k in self.delay}
        for k, v in (restored or {}).items():
            if k in self.max_event_time and v is not None:
                self.max_event_time[k] = int(v)
        self.active_since = {k: None for k in self.delay}
        self.step_marks = {s: None for s in self.step_marks}
        for s, v in (step_marks or {}).items():
            if s in self.step_marks and v is not None:
                self.step_marks[s] = int(v)

    def ran(self, step: str, watermark: int | None) -> None:
        """`step` ran an epoch under `watermark`: the steps it feeds take it next epoch."""
        self.step_marks[step] = watermark

    def observe(self, key: str, rows: int, max_ts: int | None, now_ms: int) -> None:
        if rows or self.active_since[key] is None:
            self.active_since[key] = now_ms
        if max_ts is not None:
            cur = self.max_event_time[key]
            self.max_event_time[key] = int(max_ts) if cur is None else max(cur, int(max_ts))

    def idle(self, key: str, now_ms: int) -> bool:
        timeout, since = self.idle_timeout[key], self.active_since[key]
        return timeout is not None and since is not None and now_ms - since > timeout

    def watermark(self, key: str) -> int | None:
        m = self.max_event_time[key]
        return None if m is None else m - self.delay[key]

    def combined(self, keys: list[str], now_ms: int, upstream_marks: Sequence[int | None] = ()) -> int | None:
        """The minimum watermark over `keys` and `upstream_marks`, idle keys left out (all
        idle: the largest). None while an active input has none yet."""
        inputs = [(self.watermark(k), self.idle(k, now_ms)) for k in keys]
        inputs += [(w, False) for w in upstream_marks]
        if not inputs:
            return None
        active = [w for w, idle in inputs if not idle]
        if not active:
            marks = [w for w, _ in inputs if w is not None]
            return max(marks) if marks else None
        return None if any(w is None for w in active) else min(active)  # type: ignore[type-var]

    def for_step(self, step: str, now_ms: int) -> int | None:
        upstream = [self.step_marks.get(s) for s in self.step_upstreams.get(step, [])]
        return self.combined(self.step_inputs.get(step, []), now_ms, upstream)

    def job_watermark(self, now_ms: int) -> int | None:
        """The whole job's: the minimum over every watermark (what progress and metrics show)."""
        return self.combined(sorted(self.delay), now_ms)

    def overall_max(self) -> int | None:
        known = [v for v in self.max_event_time.values() if v is not None]
        return max(known) if known else None
