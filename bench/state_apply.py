"""Micro benchmark: keys/s of KeyedAggregate.apply on one subtask (no Spark).

    python bench/state_apply.py [--keys 300000] [--epochs 5]

Each epoch applies one pre-aggregated partial per key (all keys touched: the worst
case for state access) to a real RocksDB store in a temp dir, then commits. Prints
apply keys/s (multi-get + numpy merge + buffered puts) and commit time per epoch.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import pyarrow as pa

from sparkpoint.api import KeyedAggregate
from sparkpoint.state.interfaces import EpochContext
from sparkpoint.state.store import SubtaskStateStore


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=300_000)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    op = KeyedAggregate("bench", ["user"], "amount", key_schema="user BIGINT")
    keys = np.arange(args.keys, dtype=np.int64)
    rates = []
    with tempfile.TemporaryDirectory() as tmp, SubtaskStateStore.open(f"{tmp}/state") as store:
        for epoch in range(args.epochs):
            amount = rng.random(args.keys)
            rows = pa.table({"user": keys, "__kg": keys % 128, "__count": np.ones(args.keys, np.int64),
                             "__nvalues": np.ones(args.keys, np.int64), "__sum": amount, "__min": amount,
                             "__max": amount})
            ctx = EpochContext(epoch, 0, 1, 128, None, 0)
            t0 = time.perf_counter()
            out = op.apply(store, rows, ctx)
            t1 = time.perf_counter()
            store.commit_epoch(epoch, out)
            t2 = time.perf_counter()
            rates.append(args.keys / (t1 - t0))
            print(f"epoch {epoch}: apply {rates[-1]:,.0f} keys/s ({t1 - t0:.3f} s), commit {t2 - t1:.3f} s")
    print(f"median apply: {np.median(rates):,.0f} keys/s per subtask ({args.keys:,} keys, {args.epochs} epochs)")


if __name__ == "__main__":
    main()
