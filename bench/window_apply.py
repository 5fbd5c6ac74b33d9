"""Micro benchmark: TumblingWindow.apply on one subtask (no Spark), W2's shape.

    python bench/window_apply.py [--keys 50000] [--events 250000] [--epochs 6] [--profile]

Each epoch: `--events` events over `--keys` keys spanning 100 s of event time (W2's
5,000 events per second, one subtask's half), pre-aggregated per (key, 60 s window) as
Spark hands them to the subtask, then apply with watermark = max event time - 5 s, and
commit. Prints per epoch the partials, the windows fired, apply and commit ms.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time

import numpy as np
import pyarrow as pa

from sparkpoint.api import TumblingWindow
from sparkpoint.state.interfaces import KEY_GROUP_COL, EpochContext
from sparkpoint.state.store import SubtaskStateStore

MAX_PARALLELISM = 256
SPAN_MS = 100_000


def partials(rng, keys: int, events: int, t0: int) -> pa.Table:
    key = rng.integers(0, keys, events) * 2  # the even keys: one subtask's share
    ts = t0 + np.sort(rng.integers(0, SPAN_MS, events))
    start = ts - ts % 60_000
    table = pa.table({"key": key, "window_start": start})
    grouped = table.group_by(["key", "window_start"]).aggregate([("key", "count")]).rename_columns(
        ["key", "window_start", "__count"])
    kg = (grouped.column("key").to_numpy() % (MAX_PARALLELISM // 2)).astype(np.int32)
    return grouped.append_column(KEY_GROUP_COL, pa.array(kg)), int(ts.max())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--events", type=int, default=250_000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--profile", action="store_true", help="cProfile the applies, print the top 25")
    parser.add_argument("--reopen", action="store_true",
                        help="close and reopen the store before each epoch (a subtask whose store was not kept)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    op = TumblingWindow("bench", ["key"], "ts", size="60 s", key_schema="key BIGINT")
    prof = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory() as d:
        store = SubtaskStateStore.open(d + "/db")
        t0 = 1_700_000_000_000
        for epoch in range(args.epochs):
            rows, max_ts = partials(rng, args.keys, args.events, t0 + epoch * SPAN_MS)
            ctx = EpochContext(epoch=epoch, subtask=0, parallelism=2, max_parallelism=MAX_PARALLELISM,
                               watermark_ms=max_ts - 5_000, processing_time_ms=0, final=False)
            if args.reopen and epoch:
                opening = time.perf_counter()
                store.close()
                store = SubtaskStateStore.open(d + "/db")
                print(f"  reopen {1000 * (time.perf_counter() - opening):.0f} ms")
            started = time.perf_counter()
            if prof:
                prof.enable()
            out = op.apply(store, rows, ctx)
            if prof:
                prof.disable()
            applied = time.perf_counter()
            store.commit_epoch(epoch, out.slice(0, 0))
            done = time.perf_counter()
            print(f"epoch {epoch}: {rows.num_rows:,} partials, {out.num_rows:,} fired, "
                  f"apply {1000 * (applied - started):.0f} ms, commit {1000 * (done - applied):.0f} ms")
        store.close()
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
