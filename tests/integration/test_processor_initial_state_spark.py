"""A processor's initial state in a real job: applied in the job's first epoch, once
per key, and not again when a later run restores the job's checkpoint."""

from __future__ import annotations

import pandas as pd
import pytest

import sparkpoint
from sparkpoint import GeneratorSource, ParquetSink, Pipeline, ProcessorOperator, Settings, StatefulProcessor
from sparkpoint.connectors.base import SlicePlan, SourceContext
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus

pytestmark = pytest.mark.spark
JOB = "opening-balances"
KEYS = 8
OPENING = pd.DataFrame({"key": list(range(KEYS + 2)), "opening": [1_000 * (k + 1) for k in range(KEYS + 2)]})


class Balances(StatefulProcessor):
    def init(self, handle):
        self.total = handle.getValueState("total", "amount BIGINT")

    def handleInitialState(self, key, initialState, timerValues):
        self.total.update((int(initialState["opening"].sum()),))

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows))
        amount = (self.total.get() or (0,))[0] + int(pdf["value"].sum())
        self.total.update((amount,))
        yield pd.DataFrame({"key": [key[0]], "amount": [amount]})


def source(total: int) -> GeneratorSource:
    return GeneratorSource("ev", keys=KEYS, total_events=total, max_records_per_epoch=400, disorder_ms=0)


def run(spark, tmp_path, total: int):
    op = ProcessorOperator("balances", Balances, ["key"], "key BIGINT, amount BIGINT",
                           initial_state=spark.createDataFrame(OPENING))
    pipeline = Pipeline(JOB).source(source(total)).stateful(op).sink(ParquetSink(str(tmp_path / "out")))
    settings = Settings.load(overrides={
        "pipeline.name": JOB, "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "execution.checkpointing.interval": "300 ms",
        "sparkpoint.progress": False, "restart-strategy.type": "none"})
    result = JobMaster(pipeline, settings, spark=spark).run()
    assert result.status == JobStatus.FINISHED
    return result


def expected(spark, total: int) -> dict[int, int]:
    src = source(total)
    src.open(SourceContext(spark, "reference"))
    events = src.read(SlicePlan({"0": 0, "1": 0}, {"0": total // 2, "1": total // 2})).toPandas()
    sums = events.groupby("key")["value"].sum()
    return {int(k): int(o) + int(sums.get(k, 0)) for k, o in zip(OPENING["key"], OPENING["opening"])}


def read(spark, tmp_path) -> dict[int, int]:
    state = sparkpoint.read_state(spark, str(tmp_path / "chk" / JOB)).toPandas()
    return {int(r.key): int(r.total) for r in state.itertuples()}


def test_initial_state_is_applied_at_the_first_start_and_not_again_on_restore(spark, tmp_path):
    run(spark, tmp_path, 1_600)
    assert read(spark, tmp_path) == expected(spark, 1_600)  # keys without events hold their opening
    run(spark, tmp_path, 3_200)  # restores the first run's checkpoint and goes on
    assert read(spark, tmp_path) == expected(spark, 3_200)
