"""Deduplicate in a real job on the shared Spark session: a stream of events with
re-sent copies (the same id, a later or earlier event time, other payload) keeps each
id's earliest event once, also when the job crashes between an event and its copies and
restores from a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sparkpoint import Deduplicate, FileSource, ParquetSink, Pipeline
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus
from tests.e2e.harness import read_output
from tests.inprocess import CrashPoint, job_settings, restart, start

pytestmark = pytest.mark.spark

SCHEMA = "id STRING, ts TIMESTAMP, attempt BIGINT"
FILES = 4


def write_events(directory: Path) -> pd.DataFrame:
    """File f holds ids f*10 .. f*10+9 (first attempt) and copies of the previous file's
    ids (attempt 2, a few seconds later), so copies cross epochs."""
    directory.mkdir(parents=True)
    rows = []
    for f in range(FILES):
        part = [{"id": f"e{f * 10 + i}", "ts": (f * 60 + i) * 1_000, "attempt": 1} for i in range(10)]
        if f:
            part += [{"id": f"e{(f - 1) * 10 + i}", "ts": ((f - 1) * 60 + i + 5) * 1_000, "attempt": 2}
                     for i in range(0, 10, 2)]
        part += [dict(part[0], attempt=3)]  # a copy in the same epoch, same event time
        (directory / f"{f:03d}.json").write_text("".join(
            json.dumps(dict(r, ts=pd.Timestamp(r["ts"], unit="ms", tz="UTC").isoformat())) + "\n" for r in part))
        rows += part
    frame = pd.DataFrame(rows)
    frame["ts"] = pd.to_datetime(frame["ts"], unit="ms", utc=True)
    return frame


def pipeline(tmp_path: Path) -> Pipeline:
    p = Pipeline("dedup")
    events = p.read(FileSource(str(tmp_path / "in"), schema=SCHEMA, bounded=True, max_files_per_epoch=1,
                               name="events")).watermark("ts", "2 minutes")
    events.stateful(Deduplicate("first-attempt", ["id"], "ts", within="10 minutes")) \
        .sink(ParquetSink(str(tmp_path / "out")))
    return p


def expected(frame: pd.DataFrame) -> list[tuple]:
    """Each id's earliest event, by an independent route: pandas, over all the input."""
    first = frame.sort_values(["ts", "attempt"], kind="stable").drop_duplicates("id")
    return sorted(zip(first["id"], first["attempt"]))


def got(tmp_path: Path) -> list[tuple]:
    out = read_output(tmp_path / "out").to_pandas()
    return sorted(zip(out["id"], out["attempt"]))


def test_each_id_is_kept_once_with_its_earliest_event(spark, tmp_path):
    frame = write_events(tmp_path / "in")
    job = JobMaster(pipeline(tmp_path), job_settings(tmp_path, "dedup"), spark=spark)
    assert job.run().status is JobStatus.FINISHED
    assert got(tmp_path) == expected(frame)
    assert len(expected(frame)) == FILES * 10 < len(frame)


def test_copies_after_a_crash_and_restore_are_still_dropped(spark, tmp_path):
    frame = write_events(tmp_path / "in")
    settings = job_settings(tmp_path, "dedup", **{"execution.checkpointing.interval": "200 ms"})
    first = start(pipeline(tmp_path), settings, spark, crash_at=CrashPoint.after_epoch(2)).wait_crashed()
    second = restart(first, pipeline(tmp_path), spark)
    assert second.wait().status is JobStatus.FINISHED, second.tail()
    assert second.job.restored_from is not None, "the second run restored a checkpoint of the first"
    assert got(tmp_path) == expected(frame), "nothing lost, nothing kept twice"
