"""The user's test harness: a StatefulProcessor run epoch by epoch without Spark, with a
manual watermark and processing-time clock, state peeks, and a snapshot restored into
a fresh tester through checkpoint files (tests/integration/test_processor_tester_matches_a_job.py
compares it with a real job)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sparkpoint import ProcessorOperator, StatefulProcessor
from sparkpoint.errors import ConfigError, CorruptSnapshotError
from sparkpoint.testing import ProcessorTester, TesterSnapshot
from sparkpoint.testing.harness_keys import xxh64
from tests.sessionize import GAP_MS, Sessionize

SESSIONS = "key BIGINT, session_start BIGINT, session_end BIGINT, events BIGINT"




def sessionize() -> ProcessorOperator:
    return ProcessorOperator("sessionize", Sessionize, ["key"], SESSIONS, time_mode="eventtime")


def clicks(*pairs: tuple[int, int]) -> pd.DataFrame:
    return pd.DataFrame({"key": [k for k, _ in pairs], "ts": [t for _, t in pairs]})


def rows(df: pd.DataFrame) -> list[tuple]:
    return [tuple(r) for r in df.itertuples(index=False)]


# A run of clicks in four epochs; sessions of a key split where 30 s pass without a click.
EPOCHS = [clicks((1, 0), (1, 10_000), (2, 5_000)),
          clicks((1, 20_000), (3, 50_000)),
          clicks((4, 70_000), (3, 60_000)),
          clicks((5, 200_000))]


def sessions_by_hand() -> list[tuple]:
    """The sessions of EPOCHS, computed without any processor: split each key's sorted
    event times where the gap exceeds GAP_MS (no click here is late)."""
    events = pd.concat(EPOCHS).sort_values(["key", "ts"])
    out = []
    for key, ts in events.groupby("key")["ts"]:
        run = [int(ts.iloc[0])]
        for t in ts.iloc[1:]:
            if t - run[-1] > GAP_MS:
                out.append((key, run[0], run[-1], len(run)))
                run = []
            run.append(int(t))
        out.append((key, run[0], run[-1], len(run)))
    return sorted(out)


def test_sessions_close_when_the_watermark_passes_their_timer_and_all_close_at_the_end() -> None:
    tester = ProcessorTester(sessionize(), watermark=("ts", "5 s"))
    assert rows(tester.process(EPOCHS[0])) == []
    assert tester.peek_map_state("sessions", 1) == {(0,): (10_000, 2)}
    assert tester.list_timers(1) == [40_000]
    assert tester.watermark_ms == 5_000  # the largest event time so far, minus the delay
    assert rows(tester.process(EPOCHS[1])) == []  # watermark 5 s: nothing due yet
    assert tester.peek_map_state("sessions", 1) == {(0,): (20_000, 3)}
    # watermark 45 s: key 2's session (last click 5 s) closes after this epoch's rows
    assert rows(tester.process(EPOCHS[2])) == [(2, 5_000, 5_000, 1)]
    assert tester.peek_map_state("sessions", 2) == {}
    assert tester.peek_map_state("sessions", 3) == {(50_000,): (60_000, 2)}
    assert rows(tester.advance_watermark(100_000)) == [(1, 0, 20_000, 3), (3, 50_000, 60_000, 2),
                                                       (4, 70_000, 70_000, 1)]
    assert tester.peek_map_state("sessions", 3) == {} and tester.list_timers(3) == []
    tester.process(EPOCHS[3])
    tester.finish()
    assert sorted(rows(tester.output)) == sessions_by_hand()


def test_a_snapshot_restored_into_a_fresh_tester_carries_on_like_the_uninterrupted_run() -> None:
    straight = ProcessorTester(sessionize(), watermark=("ts", "5 s"))
    for epoch in EPOCHS:
        straight.process(epoch)
    straight.finish()

    first = ProcessorTester(sessionize(), watermark=("ts", "5 s"))
    first.process(EPOCHS[0])
    first.process(EPOCHS[1])
    text = first.snapshot().to_json()
    first.process(clicks((9, 1)))  # after the snapshot: must not reach the restored tester
    restored = ProcessorTester.from_snapshot(sessionize(), text, watermark=("ts", "5 s"))
    assert restored.epoch == 1 and restored.watermark_ms == 45_000
    assert restored.peek_map_state("sessions", 1) == {(0,): (20_000, 3)}
    assert restored.peek_map_state("sessions", 9) == {}
    restored.process(EPOCHS[2])
    # The restore step rebuilt the store from the snapshot's files, each verified, in the
    # restore's generation; the first epoch works on that store instead of rebuilding again.
    assert restored.last_epoch_report["how"] == "local"
    restored.process(EPOCHS[3])
    restored.finish()
    # Nothing closed before the snapshot, so the restored run must emit all of it, in order.
    assert rows(restored.output) == rows(straight.output) == sorted(sessions_by_hand(), key=lambda r: r[2])


def test_a_snapshot_is_json_over_checkpoint_files_and_a_damaged_file_is_refused(tmp_path: Path) -> None:
    tester = ProcessorTester(sessionize(), watermark=("ts", "5 s"), directory=str(tmp_path))
    tester.process(EPOCHS[0])
    text = tester.snapshot().to_json()
    handle = json.loads(text)["lineage"]
    assert handle["format"] == "sparkpoint/state-lineage" and handle["base"]["files"]  # what `_metadata` records
    sst = next(f for f in handle["base"]["files"] if f["name"].endswith(".sst"))
    path = tmp_path / "checkpoints" / "tester" / sst["path"]
    path.write_bytes(path.read_bytes()[:-1] + b"\0")
    with pytest.raises(CorruptSnapshotError):
        ProcessorTester.from_snapshot(sessionize(), text, watermark=("ts", "5 s"))


def test_a_snapshot_of_another_step_is_refused() -> None:
    tester = ProcessorTester(sessionize())
    tester.process(EPOCHS[0])
    other = ProcessorOperator("other", Sessionize, ["key"], SESSIONS, time_mode="eventtime")
    with pytest.raises(ConfigError, match="state of step 'sessionize', not of 'other'"):
        ProcessorTester.from_snapshot(other, tester.snapshot())
    with pytest.raises(ConfigError, match="not a tester snapshot"):
        TesterSnapshot.from_json(json.dumps({"format": "x"}))


class Reminder(StatefulProcessor):
    def init(self, handle):
        self.handle = handle
        self.notes = handle.getListState("notes", "note STRING")

    def handleInputRows(self, key, rows, timerValues):
        for pdf in rows:
            self.notes.appendList([(n,) for n in pdf["note"]])
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1_000)
        return iter(())

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        notes = [n for (n,) in self.notes.get()]
        self.notes.clear()
        yield pd.DataFrame({"user": [key[0]], "notes": [",".join(notes)], "at": [expiredTimerInfo.getExpiryTimeInMs()]})


def test_processing_time_timers_fire_when_the_manual_clock_passes_them() -> None:
    op = ProcessorOperator("remind", Reminder, ["user"], "user STRING, notes STRING, at BIGINT",
                           time_mode="processingtime")
    tester = ProcessorTester(op, processing_time_ms=5_000)
    tester.process(pd.DataFrame({"note": ["a", "b"]}), key="ann")  # TwsTester's test(key, rows)
    tester.advance_processing_time(500)
    tester.process(pd.DataFrame({"user": ["bob"], "note": ["c"]}))
    assert tester.peek_list_state("notes", "ann") == [("a",), ("b",)]
    assert rows(tester.set_processing_time(5_999)) == []
    assert rows(tester.set_processing_time(6_000)) == [("ann", "a,b", 6_000)]
    assert rows(tester.advance_processing_time(10_000)) == [("bob", "c", 6_500)]
    with pytest.raises(ValueError, match="only moves forward"):
        tester.set_processing_time(1)


def test_the_watermark_only_moves_forward_and_peeks_name_the_declared_states() -> None:
    tester = ProcessorTester(sessionize())
    assert tester.watermark_ms is None  # no watermark until one is set: event-time timers wait
    tester.process(EPOCHS[0])
    tester.advance_watermark(1_000)
    with pytest.raises(ValueError, match="only moves forward: it is 1000"):
        tester.advance_watermark(999)
    with pytest.raises(ConfigError, match=r"declares no list state 'sessions' \(it declares \{'sessions': 'map'\}\)"):
        tester.peek_list_state("sessions", 1)
    with pytest.raises(ConfigError, match=r"rows already hold key column\(s\) \['key'\]"):
        tester.process(EPOCHS[1], key=1)
    tester.finish()
    with pytest.raises(ConfigError, match="input has ended"):
        tester.process(EPOCHS[1])


def test_state_and_timers_read_like_the_state_reader() -> None:
    tester = ProcessorTester(sessionize(), watermark=("ts", "5 s"))
    tester.process(EPOCHS[0])
    state = tester.state().sort_values("key")
    assert state["key"].tolist() == [1, 2]
    assert state["sessions"].tolist() == [[(0, {"last": 10_000, "events": 2})],
                                          [(5_000, {"last": 5_000, "events": 1})]]
    assert sorted(rows(tester.timers())) == [(1, 40_000), (2, 35_000)]


def test_importing_the_tester_starts_no_spark() -> None:
    code = "import sys, sparkpoint.testing; print(sorted(m for m in sys.modules if m.startswith(('pyspark', 'py4j'))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3])))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_xxh64_matches_the_reference_vectors() -> None:
    # XXH64 reference values (xxHash's own test vectors); Spark's xxhash64 is XXH64.
    assert xxh64(b"", 0) == 0xEF46DB3751D8E999
    assert xxh64(b"a", 0) == 0xD24EC4F1A98C6E5B
    assert xxh64(b"abc", 0) == 0x44BC2CF5AD770999
    assert xxh64(b"Nobody inspects the spammish repetition", 0) == 0xFBCEA83C8A378BF1


def test_a_tester_restored_from_snapshot_text_keeps_the_files_when_the_old_tester_goes() -> None:
    tester = ProcessorTester(sessionize(), watermark=("ts", "5 s"))
    tester.process(EPOCHS[0])
    tester.process(EPOCHS[1])
    # The usual shape of a test: the old tester is dropped right away, only JSON text in hand.
    tester = ProcessorTester.from_snapshot(sessionize(), tester.snapshot().to_json(), watermark=("ts", "5 s"))
    gc.collect()
    tester.process(EPOCHS[2])
    tester.process(EPOCHS[3])
    tester.finish()
    assert sorted(rows(tester.output)) == sessions_by_hand()


class PageVisits(StatefulProcessor):
    def init(self, handle):
        self.visits = handle.getMapState("visits", "page STRING", "n BIGINT")

    def handleInputRows(self, key, rows, timerValues):
        for pdf in rows:
            for page in pdf["page"]:
                self.visits.updateValue((page,), ((self.visits.getValue((page,)) or (0,))[0] + 1,))
        yield pd.DataFrame({"user": [key[0]], "device": [key[1]], "pages": [len(list(self.visits.keys()))]})


def test_map_state_of_a_two_column_key_is_peeked_by_a_tuple_after_a_restore() -> None:
    def step() -> ProcessorOperator:
        return ProcessorOperator("visits", PageVisits, ["user", "device"], "user STRING, device BIGINT, pages BIGINT")

    tester = ProcessorTester(step())
    tester.process(pd.DataFrame({"user": ["ann", "ann", "ann", "bob"], "device": [1, 1, 2, 1],
                                 "page": ["a", "b", "a", "a"]}))
    tester = ProcessorTester.from_snapshot(step(), tester.snapshot())
    out = tester.process(pd.DataFrame({"page": ["a", "c"]}), key=("ann", 1))
    assert rows(out) == [("ann", 1, 3)]
    assert tester.peek_map_state("visits", ("ann", 1)) == {("a",): (2,), ("b",): (1,), ("c",): (1,)}
    assert tester.peek_map_state("visits", ("ann", 2)) == {("a",): (1,)}
    assert tester.peek_map_state("visits", ("eve", 1)) == {}
