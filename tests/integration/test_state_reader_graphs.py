"""`sparkpoint.read_state` / `read_timers` on the steps of graph pipelines: a join's
buffered rows read from a savepoint (by a fresh operator object, so the rows' columns
come from the state itself), and the sliding, session and cumulate windows' held
windows read from a checkpoint taken mid-run; each equal to what pandas computes from
the input the savepoint or checkpoint covers."""

from __future__ import annotations

import os
import shutil
import threading
import time

import pandas as pd
import pytest

import sparkpoint
from sparkpoint import (CumulateWindow, FileSource, GeneratorSource, IntervalJoin, ParquetSink, Pipeline,
                        SessionWindow, SlidingWindow)
from sparkpoint.connectors.base import SlicePlan, SourceContext
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout
from sparkpoint.storage.metadata import decode, read_completed
from tests.inprocess import job_settings
from tests.paid_orders import write_input

pytestmark = pytest.mark.spark

FOREVER_MS = 10 ** 13  # three centuries


def _forever_join() -> IntervalJoin:
    # An interval no watermark ever passes: the state holds every row read so far.
    return IntervalJoin("paid", "order_id", "order_id", "ts", "paid_at", -FOREVER_MS, FOREVER_MS, how="left")


def test_a_join_step_reads_from_a_savepoint_as_every_row_it_buffers(spark, tmp_path):
    orders, payments = write_input(tmp_path / "in", 8)
    p = Pipeline("paid-state")

    def files(directory, schema):
        return p.read(FileSource(str(tmp_path / "in" / directory), schema=schema, bounded=True,
                                 max_files_per_epoch=1, name=directory))

    slow = files("payments", "order_id BIGINT, method STRING, paid_at BIGINT") \
        .transform(lambda df: (time.sleep(0.3), df)[1]).watermark("paid_at", "2 s")
    files("orders", "order_id BIGINT, customer STRING, amount BIGINT, ts BIGINT").watermark("ts", "2 s") \
        .join(slow, _forever_join()).sink(ParquetSink(str(tmp_path / "out"), name="paid"))
    job = JobMaster(p, job_settings(tmp_path, "paid-state"), spark=spark)
    done: dict = {}
    thread = threading.Thread(target=lambda: done.setdefault("result", job.run()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while job.epoch < 2:
        assert thread.is_alive() and time.monotonic() < deadline, "the job ended before its savepoint"
        time.sleep(0.05)
    taken = job.stop(savepoint=True).result(120)
    thread.join(120)
    assert done["result"].status is JobStatus.FINISHED
    moved = tmp_path / "elsewhere"
    shutil.move(taken, moved)
    shutil.rmtree(tmp_path / "checkpoints")  # the savepoint is read on its own

    handles = decode((moved / "_metadata").read_bytes()).handles
    read = {name: {f for files in handles[f"source:{name}"]["positions"].values() for f in files}
            for name in ("orders", "payments")}
    assert 0 < len(read["orders"]) < 8, "stopped mid-run"

    def rows_of(name: str, frame: pd.DataFrame) -> pd.DataFrame:
        parts = sorted(os.path.basename(f) for f in read[name])
        ids = {i for part in parts for i in pd.read_json(tmp_path / "in" / name / part, lines=True).order_id}
        return frame[frame.order_id.isin(ids)]

    want_left, want_right = rows_of("orders", orders), rows_of("payments", payments)
    state = sparkpoint.read_state(spark, str(moved), operator=_forever_join()).toPandas()
    assert list(state.columns) == ["order_id", "side", "time_ms", "matched", "left", "right"]
    left, right = state[state.side == "left"], state[state.side == "right"]
    got_left = pd.DataFrame([{**_plain(r.left), "matched": r.matched} for r in left.itertuples()])
    expected_left = want_left.assign(matched=want_left.order_id.isin(want_right.order_id))
    pd.testing.assert_frame_equal(got_left.sort_values("order_id").reset_index(drop=True),
                                  expected_left[list(got_left.columns)].sort_values("order_id").reset_index(drop=True),
                                  check_dtype=False)
    assert (left.time_ms.values == left.left.map(lambda r: r["ts"]).values).all()
    got_right = pd.DataFrame([_plain(r) for r in right.right]).sort_values("order_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(got_right, want_right[list(got_right.columns)].sort_values("order_id")
                                  .reset_index(drop=True), check_dtype=False)
    assert right.matched.isna().all() and left.right.isna().all() and right.left.isna().all()
    with pytest.raises(Exception, match="join 'paid' keeps no timers"):
        sparkpoint.read_timers(spark, str(moved), operator=_forever_join())


def _plain(row) -> dict:
    """A struct value as toPandas gives it (a Row, or a dict with Arrow) as a dict."""
    return row.asDict() if hasattr(row, "asDict") else dict(row)


DAY = 86_400_000
KEYS = 30
TOTAL = 16_000


def _windows():
    # A day of allowed lateness: no window is cleaned up before the end of input, so a
    # checkpoint holds every window of the input it covers.
    common = dict(aggs=("count", "sum"), value_column="value", value_type="bigint", allowed_lateness=DAY)
    return [SlidingWindow("hop", ["key"], "ts", size="200 ms", slide="100 ms", **common),
            SessionWindow("visits", ["key"], "ts", gap="4 ms", **common),
            CumulateWindow("running", ["key"], "ts", step="100 ms", size="400 ms", **common)]


def _source() -> GeneratorSource:
    return GeneratorSource("ev", keys=KEYS, total_events=TOTAL, max_records_per_epoch=2_000, disorder_ms=500)


def _expected(step, events: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for key, ev in events.groupby("key"):
        pairs = list(zip(ev.ts, ev.value))
        if isinstance(step, SessionWindow):
            sessions: list[list] = []
            for t, v in sorted(pairs):  # spans [t, t + gap) that overlap or touch are one session
                if sessions and t <= sessions[-1][1]:
                    s = sessions[-1]
                    s[1], s[2], s[3] = max(s[1], t + step.gap_ms), s[2] + 1, s[3] + v
                else:
                    sessions.append([t, t + step.gap_ms, 1, v])
            rows += [(key, s, e, n, total) for s, e, n, total in sessions]
            continue
        windows: dict[tuple[int, int], list] = {}
        for t, v in pairs:
            if isinstance(step, SlidingWindow):
                starts = range(t - t % step.slide_ms - step.size_ms + step.slide_ms, t + 1, step.slide_ms)
                spans = [(s, s + step.size_ms) for s in starts if s <= t < s + step.size_ms]
            else:
                period = t - t % step.size_ms
                spans = [(period, period + j * step.step_ms) for j in range(1, step.size_ms // step.step_ms + 1)
                         if t < period + j * step.step_ms]
            for span in spans:
                w = windows.setdefault(span, [0, 0])
                w[0], w[1] = w[0] + 1, w[1] + v
        rows += [(key, s, e, n, total) for (s, e), (n, total) in windows.items()]
    return pd.DataFrame(rows, columns=["key", "window_start", "window_end", "count", "sum"])


def test_sliding_session_and_cumulate_window_state_and_timers_equal_pandas(spark, tmp_path):
    source = _source()
    stream = Pipeline("three-windows")
    events = stream.read(source).watermark("ts", "1 s")
    for step in _windows():
        events.stateful(step).sink(ParquetSink(str(tmp_path / "out" / step.name), name=step.name))
    settings = job_settings(tmp_path, "three-windows", **{
        "execution.checkpointing.interval": "300 ms", "execution.checkpointing.num-retained": 50})
    assert JobMaster(stream, settings, spark=spark).run().status is JobStatus.FINISHED

    job_dir = tmp_path / "checkpoints" / "three-windows"
    fs = StorageFS.from_url(str(job_dir))
    ids = sorted(int(n[4:]) for n in os.listdir(job_dir) if n.startswith("chk-"))
    completed = [d for d in (read_completed(fs, JobLayout(fs.root), i) for i in ids) if d is not None]
    mid = [d for d in completed if 0 < sum(d.handles["source:ev"]["positions"].values()) < TOTAL]
    assert mid, f"no checkpoint before the end of input among {[d.checkpoint_id for d in completed]}"
    data = mid[len(mid) // 2]
    reference = _source()
    reference.open(SourceContext(spark, "reference"))
    end = data.handles["source:ev"]["positions"]
    covered = reference.read(SlicePlan({s: 0 for s in end}, dict(end))).toPandas()
    path = str(job_dir / f"chk-{data.checkpoint_id}")

    cols = ["key", "window_start", "window_end", "count", "sum"]
    for step in _windows():  # fresh operator objects, as in a separate notebook
        got = sparkpoint.read_state(spark, path, operator=step).toPandas()
        assert list(got.columns) == [*cols, "fired", "late"], step.name
        pd.testing.assert_frame_equal(got[cols].sort_values(cols[:3]).reset_index(drop=True),
                                      _expected(step, covered).sort_values(cols[:3]).reset_index(drop=True),
                                      check_dtype=False, obj=step.name)
        timers = sparkpoint.read_timers(spark, path, operator=step).toPandas()
        assert list(timers.columns) == ["key", "window_start", "window_end", "timer", "expiry_ms"]
        # One timer per held window: fire at its end until it fired, then clean-up a day later.
        want = got.assign(timer=got.fired.map({False: "fire", True: "cleanup"}),
                          expiry_ms=got.window_end + got.fired * DAY)[["key", "window_start", "window_end", "timer",
                                                                        "expiry_ms"]]
        pd.testing.assert_frame_equal(timers.sort_values(cols[:3]).reset_index(drop=True),
                                      want.sort_values(cols[:3]).reset_index(drop=True), check_dtype=False,
                                      obj=f"{step.name} timers")
