"""The pipeline builder: a source, stateless PySpark steps, at most one keyed
stateful step, and a sink.

    pipeline = (
        Pipeline("clicks-per-minute")
        .source(GeneratorSource(keys=10_000))
        .transform(lambda df: df.where("value >= 0"))          # plain PySpark
        .watermark("ts", delay="5 s")                           # event time
        .stateful(TumblingWindow("per_minute", ["key"], "ts", size="60 s"))
        .sink(ParquetSink("out/"))
    )
    pipeline.run()                                              # or: sparkpoint run file.py
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa

from sparkpoint.config import parse_duration_ms
from sparkpoint.connectors.base import Sink, Source
from sparkpoint.errors import ConfigError
from sparkpoint.state.interfaces import StatefulOperator


@dataclass
class Watermark:
    column: str
    delay_ms: int


@dataclass
class Pipeline:
    name: str | None = None
    source_: Source | None = None
    transforms: list[Callable[[Any], Any]] = field(default_factory=list)
    watermark_: Watermark | None = None
    stateful_: StatefulOperator | None = None
    output_maps: list[Callable[[pa.Table], pa.Table]] = field(default_factory=list)
    sink_: Sink | None = None

    def source(self, source: Source) -> "Pipeline":
        """The input: a GeneratorSource, FileSource or KafkaSource (or any `Source`)."""
        self.source_ = source
        return self

    def transform(self, fn: Callable[[Any], Any]) -> "Pipeline":
        """A stateless step: DataFrame -> DataFrame, run in Spark every epoch."""
        if self.stateful_ is not None:
            raise ConfigError("transform() after stateful(): stateless DataFrame steps go before the stateful "
                              "step; use map_output() for steps on the stateful step's output")
        self.transforms.append(fn)
        return self

    def watermark(self, column: str, delay: str | int) -> "Pipeline":
        """Event time is `column`: a TIMESTAMP / TIMESTAMP_NTZ column or epoch ms in an
        integer column (any other type stops the job at its first epoch with one line).
        The watermark trails the largest event time seen by `delay` (like Spark's
        withWatermark / Flink's bounded out-of-orderness)."""
        self.watermark_ = Watermark(column, parse_duration_ms(delay))
        return self

    def stateful(self, operator: StatefulOperator) -> "Pipeline":
        """The keyed stateful step: KeyedAggregate, TumblingWindow or a ProcessorOperator
        running a StatefulProcessor. Its name is its state's identity in checkpoints."""
        if self.stateful_ is not None:
            raise ConfigError("a pipeline has at most one stateful step for now")
        self.stateful_ = operator
        return self

    def map_output(self, fn: Callable[[pa.Table], pa.Table]) -> "Pipeline":
        """A step on each epoch's output (an Arrow table) before it reaches the sink."""
        self.output_maps.append(fn)
        return self

    def sink(self, sink: Sink) -> "Pipeline":
        """The output: ParquetSink, DeltaSink or KafkaSink, each exactly-once."""
        self.sink_ = sink
        return self

    def validate(self) -> None:
        """Raise one ConfigError if the pipeline cannot run (no source, no sink)."""
        if self.source_ is None:
            raise ConfigError("the pipeline has no source: call .source(...)")
        if self.sink_ is None:
            raise ConfigError("the pipeline has no sink: call .sink(...)")

    def run(self, config: str | None = None, sets: list[str] | None = None, *, spark: Any = None, **overrides: Any):
        """Run until the source is exhausted or the job is cancelled: `sparkpoint.run(self, ...)`.
        `spark`: the SparkSession to run in (default: the active one, else one sparkpoint
        creates); it keeps its settings and is not stopped. Keyword overrides use python
        names or Flink keys via a dict: run(overrides={"parallelism.default": 4})."""
        if _launcher is None:
            raise RuntimeError("no job launcher installed: import sparkpoint (its __init__ installs "
                               "sparkpoint.job.run)")
        return _launcher(self, config, sets, spark=spark, **overrides)


# The builder knows nothing of the runtime (pyproject.toml's import contracts forbid
# api -> runtime), so `Pipeline.run` goes through this hook: sparkpoint/__init__.py installs
# `sparkpoint.job.run`, and Python runs that file before any sparkpoint.* module is imported.
_launcher: Callable[..., Any] | None = None


def set_launcher(launch: Callable[..., Any]) -> None:
    global _launcher
    _launcher = launch
