"""Micro benchmark: CumulateWindow.apply on one subtask (no Spark), pane tables against
the per-window engine on the same input, epoch by epoch in the same minute.

    python bench/cumulate_apply.py [--keys 20000] [--events 300000] [--epochs 6] [--step 10s] [--size 60s]

Each epoch: `--events` raw rows (key, ts, v) over `--keys` keys spanning 100 s of event
time, applied with the watermark in effect before it (the previous epochs' largest
event time - 5 s, as the runtime passes it) and committed, once to a store kept
as pane tables and once to a store kept per window (the order alternates per epoch).
Prints per epoch and layout the apply and commit ms and the windows emitted, then each
layout's events/s over the epochs after the first (apply + commit).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import pyarrow as pa

from sparkpoint import CumulateWindow
from sparkpoint.api.windows.panes import PaneWindow
from sparkpoint.state.interfaces import KEY_GROUP_COL, EpochContext
from sparkpoint.state.store import SubtaskStateStore

MAX_PARALLELISM = 256
SPAN_MS = 100_000


class PerWindow(CumulateWindow):
    """The per-window engine, whatever the store holds."""

    def apply(self, store, rows, ctx):
        return PaneWindow.apply(self, store, rows, ctx)


def rows_of(rng, keys: int, events: int, t0: int) -> tuple[pa.Table, int]:
    key = rng.integers(0, keys, events) * 2  # the even keys: one subtask's share
    ts = t0 + np.sort(rng.integers(0, SPAN_MS, events))
    kg = (key % (MAX_PARALLELISM // 2)).astype(np.int32)
    v = rng.integers(0, 1000, events).astype(np.float64)
    return pa.table({"key": key, "ts": ts, "v": v, KEY_GROUP_COL: kg}), int(ts.max())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--step", default="10 s")
    parser.add_argument("--size", default="60 s")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    ops = {layout: cls("bench", ["key"], "ts", step=args.step, size=args.size, aggs=("count", "sum", "max"),
                       value_column="v", key_schema="key BIGINT")
           for layout, cls in (("pane tables", CumulateWindow), ("per window", PerWindow))}
    spent = {layout: 0.0 for layout in ops}
    with tempfile.TemporaryDirectory() as d:
        stores = {layout: SubtaskStateStore.open(f"{d}/{i}") for i, layout in enumerate(ops)}
        t0, watermark = 1_700_000_000_000, None
        for epoch in range(args.epochs):
            rows, max_ts = rows_of(rng, args.keys, args.events, t0 + epoch * SPAN_MS)
            ctx = EpochContext(epoch=epoch, subtask=0, parallelism=2, max_parallelism=MAX_PARALLELISM,
                               watermark_ms=watermark, processing_time_ms=0, final=False)
            watermark = max_ts - 5_000
            order = list(ops) if epoch % 2 == 0 else list(ops)[::-1]
            outs = {}
            for layout in order:
                store = stores[layout]
                started = time.perf_counter()
                outs[layout] = ops[layout].apply(store, rows, ctx)
                applied = time.perf_counter()
                store.commit_epoch(epoch, outs[layout].slice(0, 0))
                done = time.perf_counter()
                if epoch:
                    spent[layout] += done - started
                print(f"epoch {epoch} {layout:>11}: {rows.num_rows:,} rows, {outs[layout].num_rows:,} windows out, "
                      f"apply {1000 * (applied - started):.0f} ms, commit {1000 * (done - applied):.0f} ms")
            a, b = (outs[layout].sort_by([(c, "ascending") for c in ("window_start", "window_end", "key")])
                    for layout in ops)
            assert a.select(["key", "window_start", "window_end", "count", "max"]).equals(
                b.select(["key", "window_start", "window_end", "count", "max"])), "the layouts disagree"
        for store in stores.values():
            store.close()
    measured = args.events * (args.epochs - 1)
    for layout, seconds in spent.items():
        print(f"{layout:>11}: {measured / seconds:,.0f} events/s (apply + commit, epochs 1..{args.epochs - 1})")


if __name__ == "__main__":
    main()
