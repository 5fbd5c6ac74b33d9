"""Micro benchmark: SessionWindow.apply on one subtask (no Spark), the W2 session
variant's shape, session tables against the per-session engine.

    python bench/session_apply.py [--keys 10000] [--events 100000] [--epochs 6] [--gap-s 30]

Each epoch: `--events` events over `--keys` keys spanning 100 s of event time, reduced
to one partial session per (key, run of events closer than the gap), as Spark's
`session_window` hands them to the subtask; then apply with watermark = max event time
- 5 s, and commit. Both layouts get the same epochs; prints per layout the apply and
commit time, the sessions emitted (which must match) and events per second of apply.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import pyarrow as pa

from sparkpoint import SessionWindow
from sparkpoint.api.windows.base import WindowOperator
from sparkpoint.state.interfaces import KEY_GROUP_COL, EpochContext
from sparkpoint.state.store import SubtaskStateStore

MAX_PARALLELISM = 256
SPAN_MS = 100_000


class EngineSession(SessionWindow):
    """The per-session engine, whatever the store holds."""

    def apply(self, store, rows, ctx):
        return WindowOperator.apply(self, store, rows, ctx)


def partial_sessions(rng, keys: int, events: int, t0: int, gap: int) -> tuple[pa.Table, int]:
    key = rng.integers(0, keys, events) * 2  # the even keys: one subtask's share
    ts = t0 + rng.integers(0, SPAN_MS, events)
    order = np.lexsort((ts, key))
    key, ts = key[order], ts[order]
    first = np.ones(len(key), dtype=bool)
    first[1:] = (key[1:] != key[:-1]) | (ts[1:] > ts[:-1] + gap)
    at = np.flatnonzero(first)
    groups = (key[at] % (MAX_PARALLELISM // 2)).astype(np.int32)
    return pa.table({"key": key[at], "__session_start": ts[at], "__session_end": np.maximum.reduceat(ts, at) + gap,
                     "__count": np.diff(np.append(at, len(key))), KEY_GROUP_COL: groups}), int(ts.max())


def run(cls, args) -> tuple[float, float, int]:
    rng = np.random.default_rng(0)
    op = cls("bench", ["key"], "ts", gap=f"{args.gap_s} s", key_schema="key BIGINT")
    applying = committing = 0.0
    emitted = 0
    with tempfile.TemporaryDirectory() as d:
        store = SubtaskStateStore.open(d + "/db")
        watermark = None
        t0 = 1_700_000_000_000
        for epoch in range(args.epochs):
            rows, max_ts = partial_sessions(rng, args.keys, args.events, t0 + epoch * SPAN_MS, args.gap_s * 1000)
            ctx = EpochContext(epoch=epoch, subtask=0, parallelism=2, max_parallelism=MAX_PARALLELISM,
                               watermark_ms=watermark, processing_time_ms=0, final=False)
            started = time.perf_counter()
            out = op.apply(store, rows, ctx)
            applied = time.perf_counter()
            store.commit_epoch(epoch, out.slice(0, 0))
            committing += time.perf_counter() - applied
            applying += applied - started
            emitted += out.num_rows
            watermark = max_ts - 5_000
        store.close()
    return applying, committing, emitted


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--gap-s", type=int, default=30)
    args = parser.parse_args()
    for name, cls in (("engine", EngineSession), ("tables", SessionWindow), ("engine", EngineSession),
                      ("tables", SessionWindow)):
        applying, committing, emitted = run(cls, args)
        print(f"{name}: apply {1000 * applying:.0f} ms ({args.events * args.epochs / applying:,.0f} events/s), "
              f"commit {1000 * committing:.0f} ms, {emitted:,} sessions emitted", flush=True)


if __name__ == "__main__":
    main()
