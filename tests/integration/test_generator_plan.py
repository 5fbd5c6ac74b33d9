"""GeneratorSource reads every slice of one length with the same generated code: Spark
writes a range's start into the Java it compiles, so a plan that changed with each
epoch's offsets compiled new classes (and the JIT compiled them again) every epoch."""

from __future__ import annotations

import pytest

from sparkpoint import GeneratorSource
from sparkpoint.connectors.base import SourceContext

pytestmark = pytest.mark.spark


def _generated_code(spark, df) -> str:
    plan = df._jdf.queryExecution().executedPlan()
    text = spark._jvm.org.apache.spark.sql.execution.debug.package.codegenString(plan)
    # Only the Java source: the plan headers name attribute ids, which differ per DataFrame.
    return "\n".join(line for line in text.splitlines() if line.startswith("/*"))


def test_slices_of_one_length_compile_to_the_same_code_and_keep_their_events(spark) -> None:
    src = GeneratorSource("events", keys=1_000, splits=2, total_events=40_000, max_records_per_epoch=10_000)
    src.open(SourceContext(spark, "generator-plan"))
    positions, plans = src.initial_positions(), []
    while not src.is_exhausted(positions):
        plans.append(src.plan(positions))
        positions = dict(plans[-1].end)
    assert len(plans) == 4
    codes = {_generated_code(spark, src.read(p)) for p in plans}
    assert len(codes) == 1, "each epoch's slice compiled its own Java code"
    # ...and the events are still the ones of their offsets: every (split, offset) once, in range.
    rows = [r for p in plans for r in src.read(p).select("split", "offset").collect()]
    seen = sorted((r["split"], r["offset"]) for r in rows)
    assert seen == sorted((s, o) for s in (0, 1) for o in range(20_000))


def _reference_events(spark, src: GeneratorSource, split: int, start: int, end: int):
    """The events as the DataFrame API defined them before the source built its slices
    as one SQL statement: a record number's event must never change (replays, restores)."""
    from decimal import Decimal

    from pyspark.sql import functions as F

    ids = spark.range(0, end - start, numPartitions=1).select(
        (F.col("id").cast("decimal(17,0)") + F.lit(Decimal(start)).cast("decimal(17,0)")).cast("long").alias("id"))
    g = F.col("id") * F.lit(src.splits) + F.lit(split)
    jitter = F.pmod(F.xxhash64(F.lit(src.seed + 1), g), F.lit(max(1, src.disorder_ms)))
    base_ts = (F.lit(src.start_ts_ms) + (g * F.lit(1000)) / F.lit(src.event_time_per_s)).cast("long")
    return ids.select(F.pmod(F.xxhash64(F.lit(src.seed), g), F.lit(src.keys)).alias("key"),
                      F.pmod(F.xxhash64(F.lit(src.seed + 2), g), F.lit(1000)).alias("value"),
                      (base_ts - jitter).alias("ts"), F.lit(split).cast("int").alias("split"),
                      F.col("id").alias("offset"))


@pytest.mark.parametrize("settings", [
    {},
    {"keys": 3_000_000_000, "seed": -5, "start_ts_ms": 0, "event_time_per_s": 2.5, "disorder_ms": 0, "splits": 3},
    {"seed": 2**40, "start_ts_ms": -86_400_000, "event_time_per_s": 1},
])
def test_every_event_is_the_one_its_record_number_always_had(spark, settings) -> None:
    src = GeneratorSource("events", max_records_per_epoch=3_000, **settings)
    src.open(SourceContext(spark, "generator-events"))
    # Splits at different positions, one far along (offsets past 32 bits).
    start = {str(s): [0, 5_000_000_000, 17][s % 3] for s in range(src.splits)}
    plan = src.plan(start)
    got = src.read(plan)
    assert got.schema.simpleString() == "struct<key:bigint,value:bigint,ts:bigint,split:int,offset:bigint>"
    expected = None
    for split, begin in plan.start.items():
        part = _reference_events(spark, src, int(split), begin, plan.end[split])
        expected = part if expected is None else expected.unionByName(part)
    assert sorted(got.collect()) == sorted(expected.collect())
