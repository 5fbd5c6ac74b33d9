"""One epoch of a pipeline graph in Spark (the driver's side).

The nodes run in topological order over this epoch's slice of every source:
  - a source reads its slice; plain steps, unions and watermarks build DataFrames;
  - each stateful step runs its own Spark job (`stage.run_epoch`, one vectorized call
    per subtask); a two-input step first makes one keyed input of both
    (`operator.prepare_input(left, right)`);
  - a step's output comes back to the driver as Arrow, unless its only consumer is a
    sink: then the subtasks stage it through that sink's writer, as in a linear
    pipeline. Output another step reads goes back into Spark with
    `spark.createDataFrame` (it crosses the driver: docs/graphs.md notes the cost);
  - each sink gets its stream's rows: staged on the executors from a DataFrame, or
    written from the driver's Arrow table.

Watermarks are observed where they are declared (the largest event time and the row
count of that stream), except where the stream goes straight into one step, whose job
carries both. Every step's watermark for this epoch was fixed before it began
(`EventTimes.for_step`), so the epoch's outcome depends only on its input and the state
it starts from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa

from sparkpoint.api import event_time
from sparkpoint.api.pipeline import (MapOutputNode, Node, SinkNode, SourceNode, StatefulNode, TransformNode,
                                     UnionNode, WatermarkNode)
from sparkpoint.runtime.connect import observe, observed
from sparkpoint.runtime.executor.subtask import OutputStep
from sparkpoint.runtime.graph import JobGraph
from sparkpoint.runtime.stage import EpochResult, run_epoch


@dataclass
class GraphEpochResult:
    steps: dict[str, EpochResult] = field(default_factory=dict)
    records: dict[str, int] = field(default_factory=dict)  # source -> records read
    event_times: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # watermark key -> (rows, max)
    output_rows: int = 0
    sink_handles: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    sink_tables: dict[str, pa.Table] = field(default_factory=dict)

    @property
    def input_records(self) -> int:
        return sum(self.records.values())

    def with_sync_errors(self, errors: dict[str, dict[int, str]]) -> "GraphEpochResult":
        steps = {n: dataclasses.replace(r, sync_errors=errors.get(n, {})) for n, r in self.steps.items()}
        return dataclasses.replace(self, steps=steps)


def run_graph_epoch(spark, graph: JobGraph, epoch: int, read: Callable[[SourceNode], Any],
                    make_task: Callable[[StatefulNode, OutputStep], Any], worker_order: dict[str, list[int] | None],
                    writers: dict[str, Any]) -> GraphEpochResult:
    """Run `graph` once. `read(source)` is its DataFrame for this epoch's slice;
    `make_task(step, output)` the step's EpochTask; `writers[sink]` its executor-side writer
    (None: the sink stages from the driver)."""
    out = GraphEpochResult()
    values: dict[Node, Any] = {}
    source_obs: dict[str, Any] = {}
    wm_obs: dict[str, Any] = {}
    fast_wm: dict[str, str] = {}  # step name -> watermark key its job observes
    fast_count: dict[str, str] = {}  # step name -> source whose records its input count is

    def as_df(node: Node):
        v = values[node]
        # A step's output read by another step goes back into Spark from the driver.
        return spark.createDataFrame(v) if isinstance(v, pa.Table) else v

    def as_arrow(node: Node) -> pa.Table:
        v = values[node]
        return v if isinstance(v, pa.Table) else v.toArrow()

    for node in graph.order:
        if isinstance(node, SourceNode):
            df = read(node)
            step = graph.source_feeds_step(node)
            if step is not None:
                fast_count[step.name] = node.name
            else:
                df, source_obs[node.name] = observe(df, f"source-{node.name}-{epoch}", _count())
            values[node] = df
        elif isinstance(node, TransformNode):
            values[node] = node.fn(as_df(node.parents[0]))
        elif isinstance(node, WatermarkNode):
            key = graph.watermark_keys[node]
            df = as_df(node.parents[0])
            step = graph.watermark_feeds_step(node)
            if step is not None:
                fast_wm[step.name] = key
            else:
                col = node.watermark.column
                ts = event_time.spark_ms(df, col, f".watermark({col!r}, ...)")
                from pyspark.sql import functions as F

                df, wm_obs[key] = observe(df, f"watermark-{_safe(key)}-{epoch}", _count(),
                                          F.max(ts).alias("max_ts"))
            values[node] = df
        elif isinstance(node, UnionNode):
            df = as_df(node.parents[0])
            for p in node.parents[1:]:
                df = df.unionByName(as_df(p))
            values[node] = df
        elif isinstance(node, StatefulNode):
            op = node.operator
            if len(node.parents) == 2:
                df = op.prepare_input(as_df(node.parents[0]), as_df(node.parents[1]))
            else:
                df = as_df(node.parents[0])
            sink = graph.staged.get(node.name)
            if sink is not None and writers.get(sink.name) is not None:
                output = OutputStep(graph.sink_inputs[sink].maps, writers[sink.name])
            else:
                output = OutputStep((), None)
            wm_key = fast_wm.get(node.name)
            wm_node = node.parents[0] if wm_key is not None else None
            column = wm_node.watermark.column if isinstance(wm_node, WatermarkNode) else None
            result = run_epoch(spark, df, make_task(node, output), output, column, epoch, worker_order.get(node.name))
            out.steps[node.name] = result
            if wm_key is not None:
                out.event_times[wm_key] = (result.input_records, result.max_event_time_ms)
            if node.name in fast_count:
                out.records[fast_count[node.name]] = result.input_records
            if output.writer is not None:
                out.sink_handles[sink.name] = list(result.sink_handles)
                out.output_rows += result.output_rows
                values[node] = None  # staged: nothing else reads it
            else:
                values[node] = result.output
        elif isinstance(node, MapOutputNode):
            if all(isinstance(c, (MapOutputNode, SinkNode)) and _folded(graph, c) for c in graph.consumers[node]):
                continue  # a sink applies it (on the executors when it stages there)
            values[node] = node.fn(as_arrow(node.parents[0]))
        elif isinstance(node, SinkNode):
            src = graph.sink_inputs[node]
            if isinstance(src.base, StatefulNode) and graph.staged.get(src.base.name) is node \
                    and node.name in out.sink_handles:
                continue  # staged by the step's subtasks
            v = values[src.base]
            if isinstance(v, pa.Table):
                for fn in src.maps:
                    v = fn(v)
                out.sink_tables[node.name] = v
                out.output_rows += v.num_rows
            else:
                output = OutputStep(src.maps, writers.get(node.name))
                result = run_epoch(spark, v, None, output, None, epoch)
                if result.output is not None:
                    out.sink_tables[node.name] = result.output
                else:
                    out.sink_handles[node.name] = list(result.sink_handles)
                out.output_rows += result.output_rows
    for name, obs in source_obs.items():
        m = observed(obs) or {}
        out.records[name] = int(m.get("n", 0))
    for key, obs in wm_obs.items():
        m = observed(obs) or {}
        out.event_times[key] = (int(m.get("n", 0)), m.get("max_ts"))
    return out


def _folded(graph: JobGraph, node: Node) -> bool:
    """`node` (a map or a sink) is applied by a sink that reads through it."""
    if isinstance(node, SinkNode):
        return True
    return all(_folded(graph, c) for c in graph.consumers[node]) and len(graph.consumers[node]) == 1


def _count():
    from pyspark.sql import functions as F

    return F.count(F.lit(1)).alias("n")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)
