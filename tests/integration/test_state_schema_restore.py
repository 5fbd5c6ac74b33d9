"""A job's checkpoints record its processors' state schemas; a restore into a pipeline
whose processor declares its state differently accepts compatible changes (rows stored
before read the new nullable field as null, widened numbers as they were) and refuses
an incompatible one in one line before anything runs; `read_state` reads the state by
the recorded schema alone, without the operator object."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

import sparkpoint
from sparkpoint import GeneratorSource, ParquetSink, Pipeline, ProcessorOperator, Settings, StatefulProcessor
from sparkpoint.connectors.base import SlicePlan, SourceContext
from sparkpoint.errors import IncompatibleStateSchemaError
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.state_source import SCHEMA_KEY
from sparkpoint.runtime.status import JobStatus
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout
from sparkpoint.storage.metadata import encode, read_completed

pytestmark = pytest.mark.spark
JOB = "schema-evolution"
FIRST, SECOND = 2_000, 4_000  # events per run's source; the second run goes on where the first ended


def totals(schema: str):
    class Totals(StatefulProcessor):
        def init(self, handle):
            self.totals = handle.getValueState("totals", schema)

        def handleInputRows(self, key, rows, timerValues):
            pdf = pd.concat(list(rows))
            old = self.totals.get() or (0, 0)
            n, total = old[0] + len(pdf), old[1] + int(pdf["value"].sum())
            extra = (int(pdf["ts"].max()),) if "last_ts" in schema else ()
            self.totals.update((n, total, *extra))
            yield pd.DataFrame({"key": [key[0]], "n": [n]})
    return ProcessorOperator("totals", Totals, ["key"], "key BIGINT, n BIGINT")


def source(total: int) -> GeneratorSource:
    return GeneratorSource("ev", keys=12, total_events=total, max_records_per_epoch=500, disorder_ms=0)


def run(spark, tmp_path, schema: str, total: int) -> JobMaster:
    pipeline = (Pipeline(JOB).source(source(total)).stateful(totals(schema))
                .sink(ParquetSink(str(tmp_path / "out"))))
    settings = Settings.load(overrides={
        "pipeline.name": JOB, "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "execution.checkpointing.interval": "300 ms",
        "sparkpoint.progress": False, "restart-strategy.type": "none"})
    return JobMaster(pipeline, settings, spark=spark)


def completed(tmp_path) -> list:
    fs = StorageFS.from_url(str(tmp_path / "chk" / JOB))
    layout = JobLayout(fs.root)
    ids = sorted(int(p.name[4:]) for p in (tmp_path / "chk" / JOB).glob("chk-*"))
    return [d for d in (read_completed(fs, layout, i) for i in ids) if d is not None]


def latest_handles(tmp_path) -> dict:
    return completed(tmp_path)[-1].handles


def events(spark, total: int) -> pd.DataFrame:
    src = source(total)
    src.open(SourceContext(spark, "reference"))
    return src.read(SlicePlan({"0": 0, "1": 0}, {"0": total // 2, "1": total // 2})).toPandas()


def test_compatible_changes_restore_and_an_incompatible_one_stops_the_job_in_one_line(spark, tmp_path):
    assert run(spark, tmp_path, "n INT, total BIGINT", FIRST).run().status == JobStatus.FINISHED
    recorded = latest_handles(tmp_path)["state:totals/0"][SCHEMA_KEY]
    assert [s["name"] for s in recorded["states"]] == ["totals"]

    # Dropping a field is refused before anything runs: no epoch, no new checkpoint.
    before = sorted(p.name for p in (tmp_path / "chk" / JOB).glob("chk-*"))
    refused = run(spark, tmp_path, "n INT", SECOND)
    with pytest.raises(IncompatibleStateSchemaError) as e:
        refused.run()
    line = str(e.value)
    assert "\n" not in line and "step 'totals', state 'totals', field 'total' is dropped" in line
    assert "give the state a new name" in line
    assert refused.status.status == JobStatus.FAILED and refused.restarts == 0
    assert refused.coordinator.stats.registry.get_sample_value(
        "sparkpoint_restore_refusals_total", {"job_name": JOB, "reason": "INCOMPATIBLE_STATE_SCHEMA"}) == 1
    assert sorted(p.name for p in (tmp_path / "chk" / JOB).glob("chk-*")) == before

    # A widened number and an appended nullable field restore; the job goes on.
    assert run(spark, tmp_path, "n BIGINT, total BIGINT, last_ts BIGINT", SECOND).run().status == JobStatus.FINISHED

    # Read by the recorded schema alone, and equal to pandas over both runs' input.
    state = sparkpoint.read_state(spark, str(tmp_path / "chk" / JOB)).toPandas()
    got = {r.key: (r.totals["n"], r.totals["total"], r.totals["last_ts"]) for r in state.itertuples()}
    everything, first = events(spark, SECOND), events(spark, FIRST)
    second = everything.merge(first, how="left", indicator=True).query("_merge == 'left_only'")
    expected = {}
    for key, group in everything.groupby("key"):
        later = second[second["key"] == key]
        last = int(later["ts"].max()) if len(later) else None  # a key the second run never saw keeps null
        expected[key] = (len(group), int(group["value"].sum()), last)
    assert got == expected


def test_a_checkpoint_that_records_no_schema_restores_unchecked(spark, tmp_path):
    """Taken by a sparkpoint that did not record schemas yet: its _metadata is rewritten
    here without them (checksum and all, as that version wrote it)."""
    assert run(spark, tmp_path, "n INT, total BIGINT", FIRST).run().status == JobStatus.FINISHED
    for data in completed(tmp_path):
        handles = {p: {k: v for k, v in h.items() if k != SCHEMA_KEY} for p, h in data.handles.items()}
        (tmp_path / "chk" / JOB / f"chk-{data.checkpoint_id}" / "_metadata").write_bytes(
            encode(dataclasses.replace(data, handles=handles)))
    assert SCHEMA_KEY not in latest_handles(tmp_path)["state:totals/0"]

    resumed = run(spark, tmp_path, "n BIGINT, total BIGINT, last_ts BIGINT", SECOND)
    assert resumed.run().status == JobStatus.FINISHED
    assert resumed.restorer.restored_from is not None
    state = sparkpoint.read_state(spark, str(tmp_path / "chk" / JOB)).toPandas()  # recorded again from then on
    got = {r.key: (r.totals["n"], r.totals["total"]) for r in state.itertuples()}
    everything = events(spark, SECOND)
    assert got == {k: (len(g), int(g["value"].sum())) for k, g in everything.groupby("key")}
