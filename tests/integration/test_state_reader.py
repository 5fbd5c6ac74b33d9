"""Reading a job's keyed state from a checkpoint or savepoint with Spark
(sparkpoint.read_state / read_timers): what is read equals what pandas computes from
the same input, for the built-in aggregate and for a processor with value, list and
map state and timers; a savepoint-shaped copy reads the same; a damaged file is one
clear error."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pandas as pd
import pytest

import sparkpoint
from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline, ProcessorOperator, Settings, StatefulProcessor
from sparkpoint.checkpoint.interfaces import CheckpointProperties, CompletedCheckpointData
from sparkpoint.connectors.base import SlicePlan, SourceContext
from sparkpoint.errors import ConfigError
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.state_source import SCHEMA_KEY
from sparkpoint.runtime.status import JobStatus
from sparkpoint.state.changelog import Lineage, is_lineage_handle
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout
from sparkpoint.storage.metadata import encode, read_completed

pytestmark = pytest.mark.spark

FAR = 10 ** 9  # a timer this far past a key's last event stays pending until the end of input


class Profile(StatefulProcessor):
    """Per key: totals (value state, two fields), the values that are multiples of
    100 (list state), a count per value % 3 (map state), and an event-time timer at
    the key's last event + FAR."""

    def init(self, handle):
        self.handle = handle
        self.totals = handle.getValueState("totals", "n BIGINT, total BIGINT")
        self.hundreds = handle.getListState("hundreds", "value BIGINT")
        self.buckets = handle.getMapState("buckets", "bucket BIGINT", "n BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows))
        n, total = self.totals.get() if self.totals.exists() else (0, 0)
        self.totals.update((n + len(pdf), total + int(pdf["value"].sum())))
        self.hundreds.appendList([(int(v),) for v in pdf["value"] if v % 100 == 0])
        for bucket, count in (pdf["value"] % 3).value_counts().items():
            old = self.buckets.getValue((int(bucket),))
            self.buckets.updateValue((int(bucket),), (int(count) + (old[0] if old else 0),))
        for t in self.handle.listTimers():
            self.handle.deleteTimer(t)
        self.handle.registerTimer(int(pdf["ts"].max()) + FAR)
        yield pd.DataFrame({"key": [key[0]], "n": [n + len(pdf)]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        return iter(())


def _profile_operator():
    return ProcessorOperator("profile", Profile, ["key"], "key BIGINT, n BIGINT", time_mode="eventtime")


def _source():
    return GeneratorSource("ev", keys=30, total_events=16_000, max_records_per_epoch=2_000, disorder_ms=500)


def _run(spark, tmp_path, job, operator, watermark=False):
    pipeline = Pipeline(job).source(_source())
    if watermark:
        pipeline = pipeline.watermark("ts", "1 s")
    pipeline = pipeline.stateful(operator).sink(ParquetSink(str(tmp_path / f"{job}-out")))
    settings = Settings.load(overrides={
        "pipeline.name": job, "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / f"{job}-state"), "execution.checkpointing.interval": "300 ms",
        # A snapshot by count only, whatever the machine's speed: 8 epochs of 2,000 events
        # (never cut by time) give each subtask change logs for epochs 0-4, a snapshot base
        # at epoch 5 and change logs for epochs 6 and 7, so later checkpoints read both.
        "state.changelog.max-changelogs": 5, "state.changelog.periodic-materialize.interval": "10 min",
        "sparkpoint.epoch.max-duration": 0,
        "execution.checkpointing.num-retained": 50,  # keep those taken in the middle of the input
        "sparkpoint.progress": False, "restart-strategy.type": "none"})
    result = JobMaster(pipeline, settings, spark=spark).run()
    assert result.status == JobStatus.FINISHED
    return tmp_path / "chk" / job


def _checkpoints(job_dir):
    fs = StorageFS.from_url(str(job_dir))
    layout = JobLayout(fs.root)
    ids = sorted(int(n[4:]) for n in os.listdir(job_dir) if n.startswith("chk-"))
    return [d for d in (read_completed(fs, layout, i) for i in ids) if d is not None]


def _events(spark, data=None):
    """The input a checkpoint covers (all of it when `data` is None), as pandas."""
    source = _source()
    source.open(SourceContext(spark, "reference"))
    end = {"0": 8_000, "1": 8_000} if data is None else data.handles["source:ev"]["positions"]
    return source.read(SlicePlan({s: 0 for s in end}, dict(end))).toPandas()


def _savepoint_copy(job_dir, data, target):
    """What a savepoint is: the checkpoint's files under the same relative paths, and a
    `_metadata` that says savepoint."""
    for handle in data.handles.values():
        if is_lineage_handle(handle):
            for f in Lineage.from_json(handle).files():
                os.makedirs(os.path.dirname(target / f.path), exist_ok=True)
                shutil.copyfile(job_dir / f.path, target / f.path)
    try:
        props = CheckpointProperties(forced=True, periodic=False, savepoint=True)
    except TypeError:  # a metadata version without the flag: the directory shape says savepoint
        props = CheckpointProperties(forced=True, periodic=False)
    copy = CompletedCheckpointData(data.job_name, data.checkpoint_id, data.trigger_timestamp_ms,
                                   data.completion_timestamp_ms, dict(data.handles), props)
    (target / "_metadata").write_bytes(encode(copy))
    return target


def _sorted_frame(df, by="key"):
    return df.sort_values(by).reset_index(drop=True)


def test_aggregate_state_equals_pandas_from_job_dir_checkpoint_and_savepoint(spark, tmp_path):
    job_dir = _run(spark, tmp_path, "totals", KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
    events = _events(spark)
    expected = events.groupby("key")["value"].agg(["count", "sum", "min", "max"]).reset_index()

    # A fresh operator object, as in a separate notebook: key types come from the store.
    reader_op = KeyedAggregate("totals", ["key"], "value", value_type="bigint")
    latest = sparkpoint.read_state(spark, str(job_dir), operator=reader_op)
    assert latest.columns == ["key", "count", "sum", "min", "max"]
    assert latest.rdd.getNumPartitions() == 2  # one task per subtask
    got = _sorted_frame(latest.toPandas())
    pd.testing.assert_frame_equal(got, _sorted_frame(expected), check_dtype=False)

    last = _checkpoints(job_dir)[-1]
    chk = sparkpoint.read_state(spark, str(job_dir / f"chk-{last.checkpoint_id}"), operator=reader_op,
                                key_schema="key BIGINT")
    pd.testing.assert_frame_equal(_sorted_frame(chk.toPandas()), got)

    savepoint = _savepoint_copy(job_dir, last, tmp_path / "savepoints" / "sp-1")
    from_savepoint = sparkpoint.read_state(spark, str(savepoint), operator=reader_op)
    pd.testing.assert_frame_equal(_sorted_frame(from_savepoint.toPandas()), _sorted_frame(expected),
                                  check_dtype=False)

    # The checkpoint records the step's state schema: its name, or nothing (one stateful step), is enough.
    for by_schema in (sparkpoint.read_state(spark, str(job_dir)),
                      sparkpoint.read_state(spark, str(job_dir), operator="totals")):
        pd.testing.assert_frame_equal(_sorted_frame(by_schema.toPandas()), _sorted_frame(expected), check_dtype=False)
    # One written before schemas were recorded needs the operator object.
    unrecorded = dataclasses.replace(last, handles={p: {k: v for k, v in h.items() if k != SCHEMA_KEY}
                                                    for p, h in last.handles.items()})
    old = _savepoint_copy(job_dir, unrecorded, tmp_path / "savepoints" / "unrecorded")
    with pytest.raises(ConfigError, match="does not record the state schema of operator 'totals'"):
        sparkpoint.read_state(spark, str(old))
    with pytest.raises(ConfigError, match=r"holds no state of operator 'other'.*\['totals'\]"):
        sparkpoint.read_state(spark, str(job_dir), operator=KeyedAggregate("other", ["key"], "value"))
    with pytest.raises(ConfigError, match="keeps no timers"):
        sparkpoint.read_timers(spark, str(job_dir), operator=reader_op)


def _expected_profile(events):
    g = events.groupby("key")
    totals = g["value"].agg(n="count", total="sum")
    hundreds = events[events.value % 100 == 0].groupby("key")["value"].apply(sorted)
    buckets = events.assign(b=events.value % 3).groupby(["key", "b"]).size()
    rows = []
    for key, t in totals.iterrows():
        rows.append({"key": key, "totals": {"n": int(t.n), "total": int(t.total)},
                     "hundreds": [int(v) for v in hundreds[key]] if key in hundreds.index else None,
                     "buckets": {int(b): int(n) for (k, b), n in buckets.items() if k == key}})
    return {r["key"]: r for r in rows}


def _read_profile(df):
    out = {}
    for row in df.collect():
        out[row.key] = {"key": row.key, "totals": row.totals.asDict(),
                        "hundreds": sorted(row.hundreds) if row.hundreds is not None else None,
                        "buckets": dict(row.buckets)}
    return out


def test_processor_value_list_map_state_and_timers_equal_pandas(spark, tmp_path):
    op = _profile_operator()
    job_dir = _run(spark, tmp_path, "profile", op, watermark=True)
    completed = _checkpoints(job_dir)
    total = 16_000
    mid = [d for d in completed if 0 < sum(d.handles["source:ev"]["positions"].values()) < total]
    assert mid, f"no checkpoint before the end of input among {[d.checkpoint_id for d in completed]}"

    # A checkpoint in the middle: state and pending timers of the input it covers.
    data = mid[len(mid) // 2]
    events = _events(spark, data)
    path = str(job_dir / f"chk-{data.checkpoint_id}")
    state = sparkpoint.read_state(spark, path, operator=_profile_operator())
    assert state.columns == ["key", "totals", "hundreds", "buckets"]
    assert _read_profile(state) == _expected_profile(events)
    timers = sparkpoint.read_timers(spark, path, operator=_profile_operator()).toPandas()
    expected_timers = (events.groupby("key")["ts"].max() + FAR).rename("expiry_ms").reset_index()
    pd.testing.assert_frame_equal(_sorted_frame(timers), _sorted_frame(expected_timers), check_dtype=False)

    # The final checkpoint: every input row; the end of input fired every timer. The
    # pipeline itself (holding the operator object the job ran) names the operator.
    final = sparkpoint.read_state(spark, str(job_dir), operator=Pipeline("profile").stateful(op))
    assert _read_profile(final) == _expected_profile(_events(spark))
    assert sparkpoint.read_timers(spark, str(job_dir), operator=op).count() == 0

    # The same checkpoint as a savepoint, read by its own relative paths.
    savepoint = _savepoint_copy(job_dir, data, tmp_path / "savepoints" / "mid")
    shutil.rmtree(job_dir)  # the savepoint must not need the job's directory
    copy = sparkpoint.read_state(spark, str(savepoint), operator=_profile_operator())
    assert _read_profile(copy) == _expected_profile(events)


def test_a_damaged_or_missing_state_file_is_one_clear_error(spark, tmp_path):
    job_dir = _run(spark, tmp_path, "broken", KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
    def files(data):
        return [f for h in data.handles.values() if is_lineage_handle(h) for f in Lineage.from_json(h).files()]

    def has(data, suffix):
        return any(f.name.endswith(suffix) for f in files(data))

    completed = _checkpoints(job_dir)
    # A checkpoint whose state has a snapshot base and change logs: the last one (_run's
    # snapshots by count), and maybe more before it.
    chosen = next(d for d in reversed(completed) if has(d, ".changelog") and has(d, ".sst"))
    savepoint = _savepoint_copy(job_dir, chosen, tmp_path / "sp")
    victim = next(f for f in reversed(files(chosen)) if f.name.endswith(".changelog"))
    with open(savepoint / victim.path, "r+b") as f:
        f.seek(victim.size // 2)
        f.write(b"\x00garbage\x00")
    op = KeyedAggregate("totals", ["key"], "value", value_type="bigint")
    with pytest.raises(Exception) as damaged:
        sparkpoint.read_state(spark, str(savepoint), operator=op, key_schema="key BIGINT").collect()
    message = str(damaged.value)
    assert victim.path in message and "read an older checkpoint or another savepoint" in message

    # A file of a snapshot base this time (the change log above is read differently);
    # the damaged change log is repaired first, so this is the only error.
    shutil.copyfile(job_dir / victim.path, savepoint / victim.path)
    gone = next(f for f in files(chosen) if f.name.endswith(".sst"))
    os.unlink(savepoint / gone.path)
    with pytest.raises(Exception) as missing:
        sparkpoint.read_state(spark, str(savepoint), operator=op, key_schema="key BIGINT").collect()
    message = str(missing.value)
    assert gone.path in message and "missing" in message and "read an older checkpoint" in message


def test_path_that_is_not_a_checkpoint_is_refused(spark, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="holds no completed checkpoint"):
        sparkpoint.read_state(spark, str(tmp_path / "empty"), operator=_profile_operator())


def test_window_state_and_timers_equal_pandas(spark, tmp_path):
    from sparkpoint import TumblingWindow

    def window():  # lateness of a day: no window is cleaned up before the end of input
        return TumblingWindow("per_second", ["key"], "ts", size="1 s", allowed_lateness_ms=86_400_000, aggs=("count", "sum"),
                              value_column="value", value_type="bigint")

    job_dir = _run(spark, tmp_path, "windows", window(), watermark=True)
    mid = [d for d in _checkpoints(job_dir) if 0 < sum(d.handles["source:ev"]["positions"].values()) < 16_000]
    assert mid
    data = mid[len(mid) // 2]
    events = _events(spark, data).assign(window_start=lambda e: e.ts - e.ts % 1000)
    expected = (events.groupby(["key", "window_start"])["value"].agg(count="count", sum="sum").reset_index()
                .assign(window_end=lambda e: e.window_start + 1000))
    path = str(job_dir / f"chk-{data.checkpoint_id}")
    got = sparkpoint.read_state(spark, path, operator=window()).toPandas()
    assert list(got.columns) == ["key", "window_start", "window_end", "count", "sum", "fired"]
    cols = ["key", "window_start", "window_end", "count", "sum"]
    pd.testing.assert_frame_equal(_sorted_frame(got[cols], cols[:2]), _sorted_frame(expected[cols], cols[:2]),
                                  check_dtype=False)

    timers = sparkpoint.read_timers(spark, path, operator=window()).toPandas()
    cleanup = timers[timers.timer == "cleanup"]
    want = expected.assign(expiry_ms=expected.window_end + 86_400_000)[["key", "window_start", "expiry_ms"]]
    pd.testing.assert_frame_equal(_sorted_frame(cleanup[["key", "window_start", "expiry_ms"]], cols[:2]),
                                  _sorted_frame(want, cols[:2]), check_dtype=False)
    # A window has a fire timer exactly until it fired.
    fire = set(map(tuple, timers[timers.timer == "fire"][["key", "window_start"]].values.tolist()))
    unfired = set(map(tuple, got[~got.fired][["key", "window_start"]].values.tolist()))
    assert fire == unfired


def test_sql_aggregate_state_reads_from_the_checkpoint_alone_and_equals_pandas(spark, tmp_path):
    """Spark pre-aggregates the partials (any expression); the reader needs neither the
    operator object nor key types: the checkpoint records the aggregates, the store their
    partial types."""
    aggs = ["count(*) AS n", "sum(value) AS total", "count(DISTINCT value % 7) AS residues",
            "max(value) FILTER (WHERE value % 2 = 0) AS top_even"]
    job_dir = _run(spark, tmp_path, "sqltotals", KeyedAggregate("sqltotals", ["key"], aggs=aggs))
    events = _events(spark)
    expected = pd.DataFrame([
        {"key": k, "n": len(g), "total": int(g.value.sum()), "residues": g.value.mod(7).nunique(),
         "top_even": g.value[g.value % 2 == 0].max()} for k, g in events.groupby("key")])
    got = sparkpoint.read_state(spark, str(job_dir)).toPandas()
    assert list(got.columns) == ["key", "n", "total", "residues", "top_even"]
    pd.testing.assert_frame_equal(_sorted_frame(got), _sorted_frame(expected), check_dtype=False)


def test_a_real_savepoint_taken_by_stop_reads_like_its_input(spark, tmp_path):
    import threading
    import time

    from sparkpoint.storage.metadata import decode

    source = GeneratorSource("ev", keys=30, total_events=60_000, max_records_per_epoch=2_000, disorder_ms=500)
    pipeline = (Pipeline("stopped").source(source).watermark("ts", "1 s").stateful(_profile_operator())
                .sink(ParquetSink(str(tmp_path / "out"))))
    settings = Settings.load(overrides={
        "pipeline.name": "stopped", "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "execution.checkpointing.interval": "300 ms",
        "state.changelog.periodic-materialize.interval": "1 s", "sparkpoint.progress": False,
        "restart-strategy.type": "none"})
    job = JobMaster(pipeline, settings, spark=spark)
    done = {}
    thread = threading.Thread(target=lambda: done.setdefault("result", job.run()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while getattr(job, "epoch", 0) < 3:
        assert thread.is_alive() and time.monotonic() < deadline, "the job ended or stalled early"
        time.sleep(0.05)
    taken = job.stop(savepoint=True).result(120)
    thread.join(180)
    assert done["result"].status == JobStatus.FINISHED

    moved = shutil.move(taken, tmp_path / "elsewhere" / "sp")  # savepoints are relocatable
    shutil.rmtree(tmp_path / "chk")
    data = decode((tmp_path / "elsewhere" / "sp" / "_metadata").read_bytes())
    assert data.properties.savepoint
    positions = data.handles["source:ev"]["positions"]
    assert 0 < sum(positions.values()) < 60_000, "stopped before the input ended"
    source.open(SourceContext(spark, "reference"))
    events = source.read(SlicePlan({s: 0 for s in positions}, dict(positions))).toPandas()

    state = sparkpoint.read_state(spark, str(moved), operator=_profile_operator())
    assert _read_profile(state) == _expected_profile(events)
    timers = sparkpoint.read_timers(spark, str(moved), operator=_profile_operator()).toPandas()
    expected_timers = (events.groupby("key")["ts"].max() + FAR).rename("expiry_ms").reset_index()
    pd.testing.assert_frame_equal(_sorted_frame(timers), _sorted_frame(expected_timers), check_dtype=False)
