"""Event time as users write it: a Spark TIMESTAMP / TIMESTAMP_NTZ column, or epoch
milliseconds as an integer, works for `.watermark()`, `TumblingWindow` and processor
event-time timers; any other type stops the job once, with one line saying what to do."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from sparkpoint import FileSource, ParquetSink, Pipeline, ProcessorOperator, Settings, StatefulProcessor, TumblingWindow
from sparkpoint.errors import ConfigError
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus

pytestmark = pytest.mark.spark

T0 = datetime(2024, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def _events(n: int = 600) -> pd.DataFrame:
    """Keys 0..4, event times over ~10 minutes, a little out of order."""
    rows = []
    for i in range(n):
        jitter = (-1) ** i * (i % 7) * 0.3
        rows.append({"key": i % 5, "t": T0 + timedelta(seconds=i + jitter)})
    return pd.DataFrame(rows)


def _drop_files(inbox, events: pd.DataFrame, as_: str, per_file: int = 100) -> None:
    inbox.mkdir()
    for f, start in enumerate(range(0, len(events), per_file)):
        lines = []
        for r in events.iloc[start:start + per_file].itertuples():
            if as_ == "ms":
                ts = int(r.t.timestamp() * 1000)
            elif as_ == "ntz":
                ts = r.t.strftime("%Y-%m-%dT%H:%M:%S.%f")  # no offset: a wall-clock time
            else:
                ts = r.t.isoformat()
            lines.append(json.dumps({"key": r.key, "ts": ts}))
        (inbox / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")


def _settings(tmp_path, **extra):
    return Settings.load(overrides={
        "pipeline.name": "evt", "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "execution.checkpointing.interval": "500 ms",
        "sparkpoint.progress": False, "rest.enabled": False,
        # Bounded restarts: a mistake that used to loop shows up as a JobFailedError here.
        "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": 2,
        "restart-strategy.fixed-delay.delay": "10 ms", **extra})


def _read(path) -> pd.DataFrame:
    return ds.dataset(str(path), format="parquet", partitioning="hive",
                      ignore_prefixes=["_", "."]).to_table().to_pandas()


@pytest.mark.parametrize("kind,ddl", [("ms", "BIGINT"), ("tz", "TIMESTAMP"), ("ntz", "TIMESTAMP_NTZ")])
def test_tumbling_window_on_each_kind_of_event_time_column_equals_pandas(spark, tmp_path, kind, ddl):
    events = _events()
    _drop_files(tmp_path / "in", events, kind)
    pipeline = (Pipeline("evt")
                .source(FileSource(str(tmp_path / "in"), schema=f"key BIGINT, ts {ddl}", max_files_per_epoch=1,
                                   bounded=True))
                .watermark("ts", "5 s")
                .stateful(TumblingWindow("per_minute", ["key"], "ts", size="60 s"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    result = JobMaster(pipeline, _settings(tmp_path), spark=spark).run()
    assert result.status == JobStatus.FINISHED and result.restarts == 0

    out = _read(tmp_path / "out")
    # Timestamps in, timestamps out; epoch ms in, epoch ms out.
    if kind == "ms":
        assert out.window_start.dtype == "int64"
        starts = pd.to_datetime(out.window_start, unit="ms", utc=True)
    elif kind == "tz":
        assert isinstance(out.window_start.dtype, pd.DatetimeTZDtype)
        starts = out.window_start
    else:
        assert pd.api.types.is_datetime64_dtype(out.window_start) and out.window_start.dt.tz is None
        starts = out.window_start.dt.tz_localize("UTC")
    assert ((out.window_end - out.window_start) == (60_000 if kind == "ms" else pd.Timedelta("60 s"))).all()
    got = dict(zip(zip(out.key, starts), out["count"]))
    expected = events.assign(start=events.t.dt.floor("60s")).groupby(["key", "start"]).size()
    assert got == {(k, pd.Timestamp(s)): n for (k, s), n in expected.items()}


class LastSeen(StatefulProcessor):
    """Counts a key's events and remembers its latest event time (a TIMESTAMP in
    state); an event-time timer 2 s after that closes the key. Written as a pandas
    user writes it: timer times are pandas Timestamps, not epoch ms."""

    def init(self, handle):
        self.handle = handle
        self.n = handle.getValueState("n", "n BIGINT")
        self.last = handle.getValueState("last", "last TIMESTAMP")

    def handleInputRows(self, key, rows, timerValues):
        n = self.n.get()[0] if self.n.exists() else 0
        last = self.last.get()[0] if self.last.exists() else None
        for pdf in rows:
            n += len(pdf)
            m = pdf["ts"].max()
            last = m if last is None else max(pd.Timestamp(last), m)
        self.n.update((n,))
        self.last.update((last,))
        for t in self.handle.listTimers():
            self.handle.deleteTimer(t)
        self.handle.registerTimer(pd.Timestamp(last) + pd.Timedelta("2 s"))
        return iter(())

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield pd.DataFrame({"key": [key[0]], "n": [self.n.get()[0]], "last": [self.last.get()[0]]})
        self.n.clear()
        self.last.clear()


def test_processor_event_time_timers_on_a_timestamp_column_equal_pandas(spark, tmp_path):
    events = _events()
    _drop_files(tmp_path / "in", events, "tz")
    pipeline = (Pipeline("evt")
                .source(FileSource(str(tmp_path / "in"), schema="key BIGINT, ts TIMESTAMP", max_files_per_epoch=2,
                                   bounded=True))
                .watermark("ts", "1 s")
                .stateful(ProcessorOperator("last_seen", LastSeen, ["key"], "key BIGINT, n BIGINT, last TIMESTAMP",
                                            time_mode="eventtime"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    result = JobMaster(pipeline, _settings(tmp_path), spark=spark).run()
    assert result.status == JobStatus.FINISHED and result.restarts == 0
    out = _read(tmp_path / "out").sort_values("key").reset_index(drop=True)
    expected = events.groupby("key").agg(n=("t", "size"), last=("t", "max")).reset_index()
    assert out.key.tolist() == expected.key.tolist()
    assert out.n.tolist() == expected.n.tolist()
    assert [pd.Timestamp(x) for x in out["last"]] == [pd.Timestamp(x) for x in expected["last"]]


@pytest.mark.parametrize("where", ["watermark", "window"])
@pytest.mark.parametrize("ddl", ["STRING", "DOUBLE"])
def test_an_event_time_column_of_another_type_stops_the_job_once_with_one_clear_error(spark, tmp_path, where, ddl):
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "a.json").write_text(json.dumps({"key": 1, "ts": "2024-03-01T12:00:00Z" if ddl == "STRING" else 1.5})
                                  + "\n")
    pipeline = Pipeline("evt").source(FileSource(str(inbox), schema=f"key BIGINT, ts {ddl}", bounded=True))
    if where == "watermark":
        pipeline = pipeline.watermark("ts", "5 s")
    pipeline = (pipeline.stateful(TumblingWindow("per_minute", ["key"], "ts", size="60 s"))
                .sink(ParquetSink(str(tmp_path / "out"))))
    master = JobMaster(pipeline, _settings(tmp_path), spark=spark)
    with pytest.raises(ConfigError) as err:
        master.run()
    message = str(err.value)
    assert "\n" not in message
    assert "'ts'" in message and ddl.lower() in message.lower()
    assert "TIMESTAMP" in message and "epoch milliseconds" in message
    assert master.restarts == 0 and master.status.status == JobStatus.FAILED
    assert not (tmp_path / "out").exists() or not _read(tmp_path / "out").shape[0]


def test_registering_a_timer_takes_epoch_ms_or_a_timestamp_and_refuses_anything_else():
    from sparkpoint.api.event_time import timer_ms

    assert timer_ms(1_709_294_400_000) == 1_709_294_400_000
    assert timer_ms(pd.Timestamp("2024-03-01T12:00:00Z")) == 1_709_294_400_000
    assert timer_ms(datetime(2024, 3, 1, 12)) == 1_709_294_400_000  # naive means UTC, as in state
    assert timer_ms(pa.scalar(1_709_294_400_000_000, pa.timestamp("us")).as_py()) == 1_709_294_400_000
    with pytest.raises(ConfigError, match="epoch milliseconds"):
        timer_ms("2024-03-01")
