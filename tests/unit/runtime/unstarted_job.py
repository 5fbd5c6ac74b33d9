"""A JobMaster built and never run (no Spark: its session is a placeholder), for tests of
the driver's control paths with what it talks to stubbed."""

from __future__ import annotations

from pathlib import Path

from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline
from sparkpoint.config import Settings
from sparkpoint.runtime.jobmaster import JobMaster


def unstarted_job(tmp_path: Path, *sets: str) -> JobMaster:
    """The small "orders" job under `tmp_path`; `sets`: more "key=value" settings."""
    pipeline = (Pipeline("orders").source(GeneratorSource("g", keys=10, total_events=10))
                .stateful(KeyedAggregate("agg", ["key"], "value", value_type="bigint"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    settings = Settings.load(None, [f"execution.checkpointing.dir={tmp_path / 'chk'}",
                                    f"state.local.dir={tmp_path / 'state'}", "sparkpoint.progress=false", *sets],
                             base={"pipeline.name": "orders"})
    return JobMaster(pipeline, settings, spark=object())
