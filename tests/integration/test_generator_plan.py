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
