"""Event time after a stateful step: a step that reads another step's output gets the
watermark of the streams upstream, as in Flink, where a step emits what a watermark fires
*before* it forwards that watermark: the next step receives those rows while its own
watermark is still the previous one, so they are on time there. Here each stateful hop
runs one epoch behind in event time for the same reason (runtime/graph.py): under the
same watermark W, an interval join downstream of a window would drop the rows the window
fired at W as late, and would have cleaned up their partners.

Each event is enriched with its key's count in its 10 s window: TumblingWindow, then an
IntervalJoin of the events with the counts (window_end in (ts, ts + 10 s]). One file per
epoch, each 10 s of event time, so windows fire by the watermark before the end of input."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sparkpoint import FileSource, IntervalJoin, ParquetSink, Pipeline, TumblingWindow
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus
from tests.e2e.harness import read_output
from tests.inprocess import CrashPoint, job_settings, restart, start

pytestmark = pytest.mark.spark

EVENTS = "key STRING, ts TIMESTAMP, n BIGINT"
SECOND = 1_000


def write_events(directory: Path) -> pd.DataFrame:
    """Three files of 10 s each: file f has events at f*10 s + 0.5 s, 1.5 s, ... per key."""
    directory.mkdir(parents=True)
    rows = []
    for f in range(3):
        part = [{"key": key, "ts": pd.Timestamp((f * 10 + i) * SECOND + 500, unit="ms", tz="UTC").isoformat(),
                 "n": f * 100 + i}
                for i in range(10) for key in ("a", "b") if (i + (key == "b")) % 3]
        (directory / f"{f:03d}.json").write_text("".join(json.dumps(r) + "\n" for r in part))
        rows += part
    frame = pd.DataFrame(rows)
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    return frame


def window_then_join(tmp_path: Path) -> Pipeline:
    p = Pipeline("window-then-join")
    events = p.read(FileSource(str(tmp_path / "events"), schema=EVENTS, bounded=True, max_files_per_epoch=1,
                               name="events")).watermark("ts", "0 s")
    counts = events.stateful(TumblingWindow("per-10s", ["key"], "ts", size="10 s"))
    (events.join(counts, IntervalJoin("with-count", "key", "key", "ts", "window_end", lower=1, upper="10 s"))
     .sink(ParquetSink(str(tmp_path / "out"))))
    return p


def assert_every_event_has_its_count(tmp_path: Path, events_frame: pd.DataFrame, late: dict) -> None:
    got = read_output(tmp_path / "out").to_pandas()
    window = events_frame["ts"].dt.floor("10s")
    expected = events_frame.assign(count=events_frame.groupby(["key", window])["n"].transform("size"))
    got_pairs = sorted(zip(got["key"], got["n"], got["count"]))
    assert got_pairs == sorted(zip(expected["key"], expected["n"], expected["count"])), \
        f"{len(got_pairs)} events with their count, expected {len(expected)}; rows dropped as late per step: {late}"
    assert got["epoch"].nunique() >= 2, "some windows fired by the watermark, before the end of input"


def test_rows_a_window_fires_by_the_watermark_are_on_time_for_an_interval_join_after_it(spark, tmp_path):
    events_frame = write_events(tmp_path / "events")
    job = JobMaster(window_then_join(tmp_path), job_settings(tmp_path, "window-then-join"), spark=spark)
    assert job.run().status is JobStatus.FINISHED
    assert_every_event_has_its_count(tmp_path, events_frame, dict(job.late_dropped_by_step))


def test_a_window_then_join_crashed_mid_run_resumes_with_the_watermarks_its_steps_ran_under(spark, tmp_path):
    events_frame = write_events(tmp_path / "events")
    settings = job_settings(tmp_path, "window-then-join", **{"execution.checkpointing.interval": "200 ms"})
    first = start(window_then_join(tmp_path), settings, spark, crash_at=CrashPoint.after_epoch(2)).wait_crashed()
    second = restart(first, window_then_join(tmp_path), spark)
    assert second.wait().status is JobStatus.FINISHED, second.tail()
    restored = second.job.restored_from
    assert restored is not None, "the second run restored a checkpoint of the first"
    newest = max((tmp_path / "checkpoints").rglob("chk-*/_metadata"), key=lambda f: int(f.parent.name[4:]))
    job_part = json.loads(newest.read_text())["body"]["handles"]["job"]
    assert "per-10s" in job_part["step_watermarks"], "checkpoints keep the watermark each step ran under"
    assert_every_event_has_its_count(tmp_path, events_frame, dict(second.job.late_dropped_by_step))
