"""A deterministic, replayable generator of keyed events.

Record number n of split s is a pure function of (seed, s, n), so re-reading a
slice after a restore returns exactly the same events — what exactly-once needs.
Event time advances steadily (`events_per_second` per job in event time) with a
bounded disorder, like real click streams.

Columns: key BIGINT (uniform over `keys`), value BIGINT (0..999), ts BIGINT
(event time, epoch ms), split INT, offset BIGINT.
"""

from __future__ import annotations

import math
import time

from sparkpoint.connectors.base import Positions, SlicePlan, Source, SourceContext


# Precision 17 keeps the sum in Spark's long-backed decimals (up to 18 digits).
_OFFSET_TYPE = "decimal(17,0)"


class GeneratorSource(Source):
    def __init__(self, name: str = "events", *, keys: int = 100_000, splits: int = 2,
                 total_events: int | None = None, rate_per_s: float | None = None,
                 max_records_per_epoch: int = 200_000, seed: int = 7,
                 start_ts_ms: int = 1_700_000_000_000, event_time_per_s: int = 10_000,
                 disorder_ms: int = 2_000):
        self.name = name
        self.keys = keys
        self.splits = splits
        self.total_events = total_events
        self.rate_per_s = rate_per_s
        self.max_per_split = max(1, max_records_per_epoch // splits)
        self.seed = seed
        self.start_ts_ms = start_ts_ms
        self.event_time_per_s = event_time_per_s  # events per second of event time (whole job)
        self.disorder_ms = disorder_ms
        self._spark = None
        self._last_plan_at: float | None = None
        self._column_cache: dict[int, list] = {}

    @property
    def schema(self) -> str:
        return "key BIGINT, value BIGINT, ts BIGINT, split INT, offset BIGINT"

    def open(self, ctx: SourceContext) -> None:
        self._spark = ctx.spark

    def _split_total(self, s: int) -> int | None:
        if self.total_events is None:
            return None
        base, extra = divmod(self.total_events, self.splits)
        return base + (1 if s < extra else 0)

    def initial_positions(self) -> Positions:
        return {str(s): 0 for s in range(self.splits)}

    def plan(self, positions: Positions) -> SlicePlan:
        now = time.monotonic()
        budget = self.max_per_split
        if self.rate_per_s:
            # Rate limiting only shapes epoch sizes in wall time; the records are the same.
            elapsed = 0.5 if self._last_plan_at is None else max(0.0, now - self._last_plan_at)
            budget = min(budget, max(1, math.ceil(self.rate_per_s / self.splits * elapsed)))
        self._last_plan_at = now
        end = {}
        for split, start in positions.items():
            stop = start + budget
            total = self._split_total(int(split))
            end[split] = min(stop, total) if total is not None else stop
        return SlicePlan(dict(positions), end)

    def is_exhausted(self, positions: Positions) -> bool:
        if self.total_events is None:
            return False
        return all(positions.get(str(s), 0) >= (self._split_total(s) or 0) for s in range(self.splits))

    def lag(self, positions: Positions) -> dict[str, int]:
        if self.total_events is None:
            return {}
        return {str(s): (self._split_total(s) or 0) - positions.get(str(s), 0) for s in range(self.splits)}

    def _columns(self, split: int) -> list:
        """The select list that turns `spark.range` ids of one split into events; built once
        per split (each expression costs py4j round trips on every epoch otherwise)."""
        cached = self._column_cache.get(split)
        if cached is None:
            from pyspark.sql import functions as F

            g = F.col("id") * F.lit(self.splits) + F.lit(split)  # global event number
            jitter = F.pmod(F.xxhash64(F.lit(self.seed + 1), g), F.lit(max(1, self.disorder_ms)))
            base_ts = (F.lit(self.start_ts_ms) + (g * F.lit(1000)) / F.lit(self.event_time_per_s)).cast("long")
            cached = [
                F.pmod(F.xxhash64(F.lit(self.seed), g), F.lit(self.keys)).alias("key"),
                F.pmod(F.xxhash64(F.lit(self.seed + 2), g), F.lit(1000)).alias("value"),
                (base_ts - jitter).alias("ts"),
                F.lit(split).cast("int").alias("split"),
                F.col("id").alias("offset"),
            ]
            self._column_cache[split] = cached
        return cached

    def _ids(self, start: int, end: int):
        """`spark.range(start, end)` whose generated code is the same for every slice of a
        length: Spark writes a range's start into the Java code it compiles, so each epoch
        compiled new classes (Janino), which the JIT then compiled again (W1, 5 M events:
        the JIT's CPU went from 4.5 to 3.6 s). The start comes in as a decimal literal,
        which the generated code reads from its references instead."""
        from decimal import Decimal

        from pyspark.sql import functions as F

        offset = F.lit(Decimal(start)).cast(_OFFSET_TYPE)
        return self._spark.range(0, end - start, numPartitions=1).select(
            (F.col("id").cast(_OFFSET_TYPE) + offset).cast("long").alias("id"))

    def read(self, plan: SlicePlan):
        frames = [
            self._ids(start, plan.end[split]).select(*self._columns(int(split)))
            for split, start in plan.start.items() if plan.end[split] > start
        ]
        if not frames:
            return self._spark.createDataFrame([], self.schema)
        out = frames[0]
        for f in frames[1:]:
            out = out.unionByName(f)
        return out
