"""The README's examples are right on a backfill: 12 hours of clicks replayed in epochs
of two hours, so one epoch holds many of a key's sessions and windows. A processor that
folds a key's rows of one epoch into one session passes while an epoch spans less than
the gap and is silently wrong here.

Each README block with a stateful step is executed as written and its pipeline runs in
the ProcessorTester; what it emits must equal pandas' answer (for sessions: a new session
wherever a key's clicks are more than 30 s apart, as in Spark's session_window), also
with a snapshot and restore between two epochs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sparkpoint.testing import ProcessorTester

README = Path(__file__).resolve().parents[3] / "README.md"
GAP_MS = 30_000
HOUR_MS = 3_600_000
EPOCH_MS = 2 * HOUR_MS


def stateful_blocks() -> list[str]:
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)
    return [b for b in blocks if ".stateful(" in b]


def readme_pipeline(block: str):
    namespace: dict = {"__name__": "readme_block"}
    exec(compile(block, str(README), "exec"), namespace)
    return namespace["pipeline"]


def clicks(seed: int = 7, keys: int = 12) -> pd.DataFrame:
    """12 hours of clicks per key: bursts of clicks seconds apart, with pauses of
    30 s to 20 min between bursts (and some pauses exactly at the gap)."""
    rng = np.random.default_rng(seed)
    rows = []
    for key in range(keys):
        t = int(rng.integers(0, 60_000))
        while t < 12 * HOUR_MS:
            rows.append((key, t))
            pause = rng.random()
            t += int(rng.integers(1_000, 25_000)) if pause < 0.85 else \
                GAP_MS if pause < 0.88 else int(rng.integers(GAP_MS, 20 * 60_000))
    return pd.DataFrame(rows, columns=["key", "ts"]).astype("int64").assign(value=1)


def reference_sessions(events: pd.DataFrame) -> list[tuple[int, int, int, int]]:
    """(key, first click, last click, clicks) of every session: a click more than 30 s
    after the key's previous one starts a new session (one exactly 30 s after it stays in
    the session, as in Spark's session_window)."""
    ordered = events.sort_values(["key", "ts"])
    new = (ordered["key"] != ordered["key"].shift()) | (ordered["ts"].diff() > GAP_MS)
    ordered = ordered.assign(session=new.cumsum())
    grouped = ordered.groupby("session").agg(key=("key", "first"), first=("ts", "min"), last=("ts", "max"),
                                             events=("ts", "size"))
    return sorted(map(tuple, grouped[["key", "first", "last", "events"]].astype(int).to_numpy().tolist()))


def reference_minutes(events: pd.DataFrame) -> list[tuple[int, int, int]]:
    """(key, window start, clicks) of every minute a key clicked in."""
    counted = events.assign(start=events["ts"] // 60_000 * 60_000).groupby(["key", "start"]).size()
    return sorted((int(k), int(s), int(n)) for (k, s), n in counted.items())


def as_sessions(out: pd.DataFrame) -> list[tuple[int, int, int, int]]:
    """The README blocks' rows as (key, first click, last click, clicks)."""
    if "session_start" in out:
        cols = out[["key", "session_start", "session_end", "events"]]
    else:  # a session window's end is its last click + the gap
        cols = out.assign(last=out["window_end"] - GAP_MS)[["key", "window_start", "last", "events"]]
    return sorted(map(tuple, cols.astype(int).to_numpy().tolist()))


def backfill_epochs(events: pd.DataFrame) -> list[pd.DataFrame]:
    shuffled = events.sample(frac=1, random_state=3)  # Spark gives an epoch's rows in any order
    return [part for _, part in shuffled.groupby(shuffled["ts"] // EPOCH_MS)]


def test_the_readme_has_a_built_in_session_window_and_a_processor_of_several_sessions_per_epoch() -> None:
    blocks = stateful_blocks()
    assert any("SessionWindow(" in b for b in blocks)
    assert any("class Sessionize(StatefulProcessor)" in b and "getMapState" in b for b in blocks)


@pytest.mark.parametrize("restore_after", [None, 2], ids=["straight", "restored-midway"])
@pytest.mark.parametrize("block", range(len(stateful_blocks())))
def test_readme_examples_on_a_backfill_equal_pandas(block: int, restore_after: int | None) -> None:
    events = clicks()
    code = stateful_blocks()[block]
    epochs = backfill_epochs(events)
    tester = ProcessorTester(readme_pipeline(code))
    out = []
    for i, epoch in enumerate(epochs):
        out.append(tester.process(epoch))
        if i == restore_after:
            tester = ProcessorTester.from_snapshot(readme_pipeline(code), tester.snapshot())
    out.append(tester.finish())
    got = pd.concat(out)
    if "TumblingWindow(" in code:
        assert sorted(map(tuple, got[["key", "window_start", "count"]].astype(int).to_numpy().tolist())) == \
            reference_minutes(events)
        return
    expected = reference_sessions(events)
    assert len(expected) > 20 * len(epochs), "every epoch must span many gaps of a key"
    assert as_sessions(got) == expected
