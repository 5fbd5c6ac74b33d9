"""Deduplicate against a reference that replays the rows one at a time in event-time
order per epoch, over randomized out-of-order epochs (duplicates near and far apart,
rows behind the watermark), in the tester, with a restore midway and over several
subtasks. The reference knows nothing of the operator's state layout."""

from __future__ import annotations

import random

import pandas as pd
import pyarrow as pa
import pytest
from operator_support import ctx, run_partitioned, with_key_groups
from windows_support import stored_entries, watermarks

from sparkpoint import Deduplicate
from sparkpoint.errors import ConfigError
from sparkpoint.testing import ProcessorTester

DELAY = 1_000
WITHIN = 3_000


def as_rows(df: pd.DataFrame) -> list[tuple]:
    return sorted(df[["k", "ts", "n"]].itertuples(index=False, name=None))


def dedup() -> Deduplicate:
    return Deduplicate("dedup", ["k"], "ts", within=WITHIN)


def random_epochs(seed: int, epochs: int = 8, rows: int = 30) -> list[pd.DataFrame]:
    """Few keys, so duplicates are frequent; event times move 2 s per epoch and arrive up
    to 5 s out of order (some behind the watermark); `n` tells the rows apart."""
    rnd = random.Random(seed)
    out, n = [], 0
    for e in range(epochs):
        ts = [max(0, e * 2_000 + rnd.randrange(-5_000, 2_000)) // 250 * 250 for _ in range(rows)]
        out.append(pd.DataFrame({"k": [rnd.choice("abcd") for _ in ts], "ts": ts,
                                 "n": list(range(n, n + rows))}).astype({"ts": "int64"}))
        n += rows
    return out


def reference(epochs: list[pd.DataFrame], delay: int, within: int) -> tuple[list[list[tuple]], int]:
    """Each epoch's kept rows (in input order) and the late rows dropped: per epoch with
    watermark W, keys held until W >= first + within are released, rows below W are late,
    then the rows in event-time order (input order on ties) keep a key's first one."""
    held: dict[str, int] = {}  # key -> release time
    outputs, dropped = [], 0
    for rows, w in zip(epochs, watermarks(epochs, delay)):
        if w is not None:
            held = {k: t for k, t in held.items() if t > w}
        kept = []
        for r in sorted(rows.itertuples(index=False), key=lambda r: r.ts):
            if w is not None and r.ts < w:
                dropped += 1
            elif r.k not in held:
                held[r.k] = r.ts + within
                kept.append(r)
        outputs.append(sorted(((r.k, r.ts, r.n) for r in kept), key=lambda t: t[2]))
    outputs.append([])  # the end of input emits nothing more
    return outputs, dropped


def run(epochs: list[pd.DataFrame], snapshot_after: int | None = None) -> tuple[list[list[tuple]], int]:
    tester = ProcessorTester(dedup(), watermark=("ts", DELAY))
    outputs = []
    for e, rows in enumerate(epochs):
        outputs.append(sorted(as_rows(tester.process(rows)), key=lambda t: t[2]))
        if snapshot_after == e:
            tester = ProcessorTester.from_snapshot(dedup(), tester.snapshot().to_json(), watermark=("ts", DELAY))
    outputs.append(as_rows(tester.finish()))
    return outputs, tester.late_rows_dropped


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_dedup_equals_a_reference_replaying_the_rows_and_a_restore_midway_changes_nothing(seed: int) -> None:
    epochs = random_epochs(seed)
    expected, expected_dropped = reference(epochs, DELAY, WITHIN)
    assert sum(map(len, expected)) < sum(map(len, epochs)) - expected_dropped, "the input has duplicates"
    assert expected_dropped > 0, "some rows are late"
    assert run(epochs) == (expected, expected_dropped)
    assert run(epochs, snapshot_after=3) == (expected, expected_dropped)


@pytest.mark.parametrize("parallelism", [1, 3])
def test_dedup_over_several_subtasks_keeps_the_same_rows(tmp_path, parallelism: int) -> None:
    epochs = random_epochs(seed=7)
    expected, _ = reference(epochs, DELAY, WITHIN)
    step, marks, got = dedup(), watermarks(epochs, DELAY), []
    for e, rows in enumerate([*epochs, None]):
        table = with_key_groups(pa.Table.from_pandas(rows if rows is not None else epochs[0].iloc[:0],
                                                     preserve_index=False), ["k"])
        context = ctx(e, None, final=True) if rows is None else ctx(e, marks[e])
        got.append(sorted(as_rows(run_partitioned(tmp_path, step, table, context, parallelism).to_pandas()),
                          key=lambda t: t[2]))
    assert got == expected


def test_a_duplicate_within_the_bound_is_dropped_and_one_after_the_watermark_passes_it_is_kept() -> None:
    tester = ProcessorTester(dedup(), watermark=("ts", 0))
    assert as_rows(tester.process([{"k": "a", "ts": 1_000, "n": 1}])) == [("a", 1_000, 1)]
    assert as_rows(tester.process([{"k": "a", "ts": 3_999, "n": 2}])) == [], "within 3 s of the first"
    tester.advance_watermark(4_000)  # the first row's time + within: the key is released
    assert as_rows(tester.process([{"k": "a", "ts": 4_000, "n": 3}])) == [("a", 4_000, 3)]
    assert tester.late_rows_dropped == 0


def test_within_one_epoch_the_earliest_row_of_a_key_is_kept_whatever_the_input_order() -> None:
    rows = [{"k": "a", "ts": 2_000, "n": 1}, {"k": "a", "ts": 1_000, "n": 2}, {"k": "a", "ts": 1_000, "n": 3}]
    assert as_rows(ProcessorTester(dedup()).process(rows)) == [("a", 1_000, 2)]


def test_rows_behind_the_watermark_are_dropped_and_counted_and_nothing_is_late_at_the_end_of_input() -> None:
    tester = ProcessorTester(dedup(), watermark=("ts", 0))
    tester.process([{"k": "a", "ts": 10_000, "n": 1}])
    assert as_rows(tester.process([{"k": "b", "ts": 9_999, "n": 2}])) == []
    assert tester.late_rows_dropped == 1
    assert as_rows(tester.finish()) == []


def test_released_keys_leave_no_state_behind() -> None:
    tester = ProcessorTester(dedup(), watermark=("ts", 0))
    tester.process([{"k": k, "ts": 1_000, "n": i} for i, k in enumerate("abc")])
    assert len(stored_entries(tester)) == 6, "each key and its release time"
    tester.advance_watermark(4_000)
    assert stored_entries(tester) == []


def test_bad_options_are_one_line() -> None:
    with pytest.raises(ConfigError, match="within must be > 0"):
        Deduplicate("d", ["k"], "ts", within=0)
    with pytest.raises(ConfigError, match="cannot also be a key column"):
        Deduplicate("d", ["k", "ts"], "ts", within="1 s")
    with pytest.raises(ConfigError, match="within"):
        Deduplicate("d", "k", "ts", within="soon")
