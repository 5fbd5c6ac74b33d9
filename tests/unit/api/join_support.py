"""Drives a join through the test harness epoch by epoch, and computes what it must
output with brute force (nested loops over every left and right row), independently of
the operator's state machinery.

A plan is a list of harness epochs; each is one of
    ("rows", left_rows, right_rows)   rows arrive (under the watermark and processing time in effect)
    ("watermark", ms)                 the watermark moves (an epoch without rows)
    ("time", ms)                      processing time moves (an epoch without rows)
    ("final",)                        end of input
Rows are dicts; each side's dicts carry the same columns.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any, Callable

import pandas as pd
import pyarrow as pa

from sparkpoint.state.keys import META_PREFIX
from sparkpoint.testing.harness import ProcessorTester

LEFT_SCHEMA = pa.schema([("id", pa.int64()), ("k2", pa.string()), ("ts", pa.int64()), ("v", pa.string())])
RIGHT_SCHEMA = pa.schema([("id", pa.int64()), ("k2", pa.string()), ("ts", pa.int64()), ("w", pa.float64())])


def _on_grid(rng: random.Random, t: int) -> int:
    """Half the times land on multiples of 50 (window bounds, interval ends), where
    off-by-one mistakes show."""
    return t - t % 50 if rng.random() < 0.5 else t


def random_rows(rng: random.Random, n: int, side: str, start: int, span: int) -> list[dict]:
    rows = []
    for i in range(n):
        row: dict[str, Any] = {
            "id": None if rng.random() < 0.05 else rng.randrange(5),
            "k2": rng.choice(["a", "b"]),
            "ts": None if rng.random() < 0.03 else _on_grid(rng, start + rng.randrange(span)),
        }
        if side == "left":
            row["v"] = f"l{start}-{i}"
        else:
            row["w"] = float(rng.randrange(1000))
        rows.append(row)
    return rows


def random_plan(rng: random.Random, epochs: int = 7, per_epoch: int = 12, step: int = 100,
                with_time: bool = False) -> list[tuple]:
    """Rows arrive roughly in event-time order, out of order within a few steps; the
    watermark trails the largest event time by a random delay, so some rows are late."""
    plan: list[tuple] = []
    max_ts = None
    watermark = None
    now = 0
    for e in range(epochs):
        start = max(0, e * step - rng.randrange(2 * step))
        left = random_rows(rng, rng.randrange(per_epoch + 1), "left", start, 2 * step)
        right = random_rows(rng, rng.randrange(per_epoch + 1), "right", start, 2 * step)
        rng.shuffle(left)
        rng.shuffle(right)
        plan.append(("rows", left, right))
        seen = [r["ts"] for r in left + right if r["ts"] is not None]
        if seen:
            max_ts = max([*seen, *([max_ts] if max_ts is not None else [])])
        if max_ts is not None and rng.random() < 0.8:
            proposed = _on_grid(rng, max_ts - rng.randrange(step))
            if watermark is None or proposed > watermark:
                watermark = proposed
                plan.append(("watermark", watermark))
        if with_time and rng.random() < 0.7:
            now += 50 * rng.randrange(7)  # on a grid, so a TTL runs out exactly at some epochs
            plan.append(("time", now))
    return plan


def table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def normalized(df: pd.DataFrame) -> list[tuple]:
    """Rows as tuples, nulls as None (pandas turns a null integer into NaN)."""
    return [tuple(None if isinstance(x, float) and math.isnan(x) else x for x in row)
            for row in df.itertuples(index=False)]


def run(make_op: Callable[[], Any], plan: list[tuple], *, restore_at: int | None = None,
        left_schema: pa.Schema = LEFT_SCHEMA,
        right_schema: pa.Schema = RIGHT_SCHEMA) -> tuple[list[list[tuple]], ProcessorTester]:
    """Each harness epoch's output rows; with `restore_at`, the state is snapshotted
    after that many epochs and the rest runs in a fresh harness restored from it, with
    a fresh operator (nothing carried in Python)."""
    op = make_op()
    tester = ProcessorTester(op)
    outputs = []
    for i, step in enumerate(plan):
        if restore_at is not None and i == restore_at:
            op = make_op()
            tester = ProcessorTester.from_snapshot(op, tester.snapshot())
        if step[0] == "rows":
            out = tester.process(op.tag_rows(table(step[1], left_schema), table(step[2], right_schema)))
        elif step[0] == "watermark":
            out = tester.advance_watermark(step[1])
        elif step[0] == "time":
            out = tester.set_processing_time(step[1])
        else:
            out = tester.finish()
        outputs.append(normalized(out))
    return outputs, tester


def epochs_of(plan: list[tuple]) -> list[dict]:
    """Per harness epoch: the watermark and processing time it runs with, and whether
    it is the final one."""
    watermark, now = None, 0
    out = []
    for step in plan:
        if step[0] == "watermark":
            watermark = step[1]
        elif step[0] == "time":
            now = step[1]
        final = step[0] == "final"
        out.append({"watermark": None if final else watermark, "time": now, "final": final})
    return out


def arrivals(plan: list[tuple], side: int) -> list[tuple[int, dict]]:
    """(epoch, row) of every row of one side (0 left, 1 right), in order."""
    return [(e, row) for e, step in enumerate(plan) if step[0] == "rows" for row in step[1 + side]]


def combined(left: dict | None, right: dict | None, shared: tuple[str, ...], left_cols: list[str],
             right_cols: list[str]) -> tuple:
    """An output row: the left columns (a shared key from whichever side is present),
    then the right columns that are not shared keys."""
    values = []
    for c in left_cols:
        if c in shared:
            values.append(left[c] if left is not None else right[c])  # type: ignore[index]
        else:
            values.append(None if left is None else left[c])
    for c in right_cols:
        if c not in shared:
            values.append(None if right is None else right[c])
    return tuple(values)


def as_counters(per_epoch: list[list[tuple]]) -> list[Counter]:
    return [Counter(rows) for rows in per_epoch]


def state_entries(tester: ProcessorTester) -> int:
    """Keyed state entries left in the tester's store (metadata not counted)."""
    state = tester._open_state()
    try:
        return sum(1 for k, _ in state.store.scan_range(b"", META_PREFIX))
    finally:
        state.store.discard_pending()
        state.close(keep=True)
