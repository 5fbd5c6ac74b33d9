"""One of Nexmark's three streams (person, auction or bid) as a replayable source.

The position is the next event number: a plan is a range [start, end) of event numbers,
and `read` keeps the rows of this source's stream among them. Three sources of one job,
one per stream, with the same config and epoch size, therefore move through event time
together, as the streams of one nexmark-flink generator do.

The rows are generated on Spark's executors, `chunk_events` event numbers per task:
every value is a pure function of (seed, event number) (connectors/nexmark.py), so a
replayed plan gives the same rows on any executor. With `events` the stream ends after
event `events - 1`; without it the stream has no end.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from sparkpoint.connectors.base import Positions, SlicePlan, Source, SourceContext
from sparkpoint.connectors.nexmark import STREAMS, NexmarkConfig, NexmarkGenerator
from sparkpoint.errors import ConfigError

_SPLIT = "events"

# nexmark-flink's DDL, column for column (docs/nexmark.md).
DDL = {
    "person": "id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, state STRING, "
              "dateTime TIMESTAMP, extra STRING",
    "auction": "id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, "
               "dateTime TIMESTAMP, expires TIMESTAMP, seller BIGINT, category BIGINT, extra STRING",
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, dateTime TIMESTAMP, "
           "extra STRING",
}
_TIME_COLUMNS = ("dateTime", "expires")


def check_stream(stream: str) -> str:
    if stream not in STREAMS:
        raise ConfigError(f"unknown nexmark stream {stream!r}: use one of {', '.join(STREAMS)}")
    return stream


class NexmarkSource(Source):
    """`stream` ("person", "auction" or "bid") of the events 0 .. `events` - 1 (no end when
    None) of the generator with `seed` (or a whole `config`), at most
    `max_events_per_epoch` event numbers per epoch."""

    def __init__(self, stream: str, *, events: int | None = None, seed: int = 0,
                 config: NexmarkConfig | None = None, max_events_per_epoch: int = 200_000,
                 chunk_events: int = 50_000, name: str | None = None):
        self.stream = check_stream(stream)
        if events is not None and events < 0:
            raise ConfigError(f"NexmarkSource {stream!r}: events must be >= 0 (or None for no end), got {events}")
        if max_events_per_epoch < 1 or chunk_events < 1:
            raise ConfigError(f"NexmarkSource {stream!r}: max_events_per_epoch and chunk_events must be at least 1")
        if config is not None and seed not in (0, config.seed):
            raise ConfigError(f"NexmarkSource {stream!r}: give the seed in config or as seed=, not both")
        self.config = config or NexmarkConfig(seed=seed)
        self.events = events
        self.max_events_per_epoch = max_events_per_epoch
        self.chunk_events = chunk_events
        self.name = name or stream
        self._spark: Any = None

    @property
    def schema(self) -> str:
        return DDL[self.stream]

    def open(self, ctx: SourceContext) -> None:
        self._spark = ctx.spark

    def initial_positions(self) -> Positions:
        return {_SPLIT: 0}

    def plan(self, positions: Positions) -> SlicePlan:
        start = int(positions[_SPLIT])
        end = start + self.max_events_per_epoch
        if self.events is not None:
            end = min(end, self.events)
        return SlicePlan({_SPLIT: start}, {_SPLIT: max(start, end)})

    def is_exhausted(self, positions: Positions) -> bool:
        return self.events is not None and int(positions[_SPLIT]) >= self.events

    def lag(self, positions: Positions) -> dict[str, int]:
        if self.events is None:
            return {}
        return {_SPLIT: max(0, self.events - int(positions[_SPLIT]))}

    def read(self, plan: SlicePlan):
        from pyspark.sql import functions as F

        start, end = int(plan.start[_SPLIT]), int(plan.end[_SPLIT])
        tasks = math.ceil(max(0, end - start) / self.chunk_events)
        # Event times leave the tasks as epoch milliseconds and become TIMESTAMPs in Spark:
        # how a TIMESTAMP is labelled in Arrow batches differs between PySpark versions.
        generated = self._spark.range(0, tasks, 1, max(tasks, 1)).mapInArrow(
            _GenerateChunks(self.config, self.stream, start, end, self.chunk_events),
            DDL[self.stream].replace("TIMESTAMP", "BIGINT"))
        return generated.select(*[F.timestamp_millis(c).alias(c) if c in _TIME_COLUMNS else F.col(c)
                                  for c in generated.columns])


class _GenerateChunks:
    """mapInArrow function: input row i generates event numbers [start + i * chunk, ...)."""

    def __init__(self, config: NexmarkConfig, stream: str, start: int, end: int, chunk: int):
        self.config, self.stream, self.start, self.end, self.chunk = config, stream, start, end, chunk

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        generator = NexmarkGenerator(self.config)
        for batch in batches:
            for i in batch.column(0).to_pylist():
                first = self.start + i * self.chunk
                table = generator.events(first, min(self.chunk, self.end - first)).stream(self.stream)
                for column in _TIME_COLUMNS:
                    if column in table.column_names:
                        index = table.column_names.index(column)
                        table = table.set_column(index, column, table.column(column).cast(pa.int64()))
                yield from table.to_batches()
