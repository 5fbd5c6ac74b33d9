"""A pipeline runs inside the user's own SparkSession, handed to it (`pipeline.run(spark=...)`)
or active on the thread (`sparkpoint.run(...)` in a notebook or a spark-submit script), and
that session keeps every setting its owner made: shuffle partitions, adaptive execution, its
time zone, a custom key. The output is still exactly the reference.

The handed session is a `newSession()` of the shared test session: its own SQL settings on
the same SparkContext, so no second JVM is started. The active session is the shared one
itself (the session `SparkSession.builder.getOrCreate()` returns in a notebook), with the
owner's settings made for the test and put back after it."""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import pandas as pd
import pyarrow.dataset as ds
import pytest

import sparkpoint
from sparkpoint import FileSource, ParquetSink, Pipeline, TumblingWindow
from sparkpoint.runtime.status import JobStatus

pytestmark = pytest.mark.spark

T0 = datetime(2024, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
USER_SETTINGS = {
    "spark.sql.shuffle.partitions": "7",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.session.timeZone": "America/Los_Angeles",
    "spark.myteam.marker": "kept",
}


def _events(n: int = 600) -> pd.DataFrame:
    rows = [{"key": i % 7, "t": T0 + timedelta(seconds=i * 0.8 + (-1) ** i * (i % 5) * 0.3)} for i in range(n)]
    return pd.DataFrame(rows)


def _drop_files(inbox, events: pd.DataFrame, per_file: int = 200) -> None:
    inbox.mkdir()
    for f, start in enumerate(range(0, len(events), per_file)):
        lines = [json.dumps({"key": int(r.key), "ts": r.t.isoformat()})
                 for r in events.iloc[start:start + per_file].itertuples()]
        (inbox / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")


@contextmanager
def _owner_settings(session):
    """The owner's settings on `session` for the test, the session's own ones again after it."""
    before = {k: session.conf.get(k, None) for k in USER_SETTINGS}
    for key, value in USER_SETTINGS.items():
        session.conf.set(key, value)
    try:
        yield session
    finally:
        for key, value in before.items():
            if value is None:
                session.conf.unset(key)
            else:
                session.conf.set(key, value)


@pytest.mark.parametrize("handed", ["spark=session", "active session"])
def test_a_pipeline_in_the_users_session_keeps_its_settings_and_is_exactly_once(spark, tmp_path, handed):
    from pyspark.sql import SparkSession

    assert SparkSession.getActiveSession() is spark  # what a notebook's `spark` is
    events = _events()
    _drop_files(tmp_path / "in", events)
    seen_by_steps: list[str] = []

    def remember_session(df):
        seen_by_steps.append(df.sparkSession.conf.get("spark.myteam.marker", "another session"))
        return df

    pipeline = (Pipeline("users-session")
                .source(FileSource(str(tmp_path / "in"), schema="key BIGINT, ts TIMESTAMP", max_files_per_epoch=1,
                                   bounded=True))
                .transform(remember_session)
                .watermark("ts", "5 s")
                .stateful(TumblingWindow("per_minute", ["key"], "ts", size="60 s"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    overrides = {"execution.checkpointing.dir": str(tmp_path / "chk"), "state.local.dir": str(tmp_path / "state"),
                 "execution.checkpointing.interval": "500 ms", "sparkpoint.progress": False,
                 "rest.enabled": False, "restart-strategy.type": "none", "parallelism.default": 3}
    with _owner_settings(spark.newSession() if handed == "spark=session" else spark) as user:
        if handed == "spark=session":
            result = pipeline.run(spark=user, overrides=overrides)
        else:
            result = sparkpoint.run(pipeline, overrides=overrides)

        assert result.status == JobStatus.FINISHED and result.restarts == 0
        assert seen_by_steps and set(seen_by_steps) == {"kept"}  # every epoch ran in the user's session
        assert {k: user.conf.get(k) for k in USER_SETTINGS} == USER_SETTINGS
        assert user.range(3).count() == 3  # not stopped

    out = ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive",
                     ignore_prefixes=["_", "."]).to_table().to_pandas()
    got = sorted(zip(out.key, out.window_start, out["count"]))
    expected = events.assign(start=events.t.dt.floor("60s")).groupby(["key", "start"]).size()
    assert got == sorted((k, pd.Timestamp(s), n) for (k, s), n in expected.items())
