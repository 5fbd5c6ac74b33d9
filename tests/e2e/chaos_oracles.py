"""What the chaos tests' pipelines must commit, computed from their input alone (batch,
no sparkpoint, no Spark): a failure-free reference job would cost a Spark start and the
whole input again, and could share a bug with the job it checks.

- user totals: the Kafka pipelines' records, every user an epoch touched with its running
  count, max, min and sum (`user_totals_records`).
- windows: GeneratorSource events into tumbling event-time windows. Record n of split s
  is event g = n * splits + s; its key, value and event time are Spark SQL's xxhash64
  of g (GeneratorSource._slice_sql), recomputed here. Valid while no event is late
  (disorder below the watermark delay), when the windows do not depend on epochs.
"""

from __future__ import annotations

import json
import struct
from typing import Iterable


def spark_xxhash64(seed: int, n: int) -> int:
    """Spark SQL's `xxhash64(seed, n)` for an INT literal and a BIGINT (Spark folds the
    columns into XXH64 one after another, starting from seed 42), as a signed long."""
    import xxhash

    h = xxhash.xxh64_intdigest(struct.pack("<i", seed), seed=42)
    h = xxhash.xxh64_intdigest(struct.pack("<q", n), seed=h)
    return h - (1 << 64) if h >= 1 << 63 else h


def window_rows(total: int, *, keys: int, splits: int = 2, seed: int = 7, event_time_per_s: int = 10_000,
                disorder_ms: int = 2_000, start_ts_ms: int = 1_700_000_000_000,
                window_ms: int = 2_000) -> list[dict[str, int]]:
    """Every window of a GeneratorSource's `total` events with TumblingWindow(["key"],
    "ts", size=window_ms, aggs=("count", "sum")): key, window_start, window_end, count, sum."""
    windows: dict[tuple[int, int], list[int]] = {}
    base, extra = divmod(total, splits)
    for s in range(splits):
        for n in range(base + (1 if s < extra else 0)):
            g = n * splits + s
            key = spark_xxhash64(seed, g) % keys
            value = spark_xxhash64(seed + 2, g) % 1000
            ts = int(start_ts_ms + (g * 1000) / event_time_per_s) - spark_xxhash64(seed + 1, g) % max(1, disorder_ms)
            acc = windows.setdefault((key, ts - ts % window_ms), [0, 0])
            acc[0] += 1
            acc[1] += value
    return [{"key": k, "window_start": w, "window_end": w + window_ms, "count": c, "sum": v}
            for (k, w), (c, v) in windows.items()]


def aggregate_updates(total: int, *, keys: int, per_epoch: int, splits: int = 2, seed: int = 7,
                      with_epoch: bool = True) -> list[dict[str, int]]:
    """Every row a GeneratorSource's `total` events into KeyedAggregate(["key"], "value",
    value_type="bigint") commits in update mode: per epoch, each key the epoch touched
    with its running count, sum, min and max. Epoch e reads records [e * m, (e + 1) * m)
    of every split, m = per_epoch // splits (GeneratorSource.plan without a rate), so the
    updates are a pure function of the input; `epoch` is the epoch's number (from 0)."""
    m = max(1, per_epoch // splits)
    base, extra = divmod(total, splits)
    lengths = [base + (1 if s < extra else 0) for s in range(splits)]
    state: dict[int, list[int]] = {}
    rows: list[dict[str, int]] = []
    epoch = 0
    while any(epoch * m < n for n in lengths):
        touched = set()
        for s in range(splits):
            for n in range(epoch * m, min((epoch + 1) * m, lengths[s])):
                g = n * splits + s
                key = spark_xxhash64(seed, g) % keys
                value = spark_xxhash64(seed + 2, g) % 1000
                acc = state.get(key)
                if acc is None:
                    state[key] = [1, value, value, value]
                else:
                    acc[0] += 1
                    acc[1] += value
                    acc[2] = min(acc[2], value)
                    acc[3] = max(acc[3], value)
                touched.add(key)
        for key in touched:
            c, s_, lo, hi = state[key]
            row = {"key": key, "count": c, "sum": s_, "min": lo, "max": hi}
            rows.append({**row, "epoch": epoch} if with_epoch else row)
        epoch += 1
    return rows


def as_canonical(rows: list[dict[str, int]], columns: list[str]) -> list[tuple]:
    """Oracle rows as tests.e2e.harness.canonical orders a committed table's."""
    return sorted(tuple(row[c] for c in columns) for row in rows)


def user_totals_records(epochs: Iterable[Iterable[tuple[str, int]]]) -> list[tuple[str, str]]:
    """(key, JSON value) of every record a Kafka pipeline of running totals per user commits
    (examples/kafka_pipeline.py's to_kafka_records; the storm's KAFKA_PIPELINE): for each
    epoch's (user, amount) events in order, every user the epoch touched, once, with its
    count, max, min and sum so far."""
    totals: dict[str, tuple[int, int, int, int]] = {}
    out: list[tuple[str, str]] = []
    for events in epochs:
        touched = set()
        for user, amount in events:
            c = totals.get(user)
            totals[user] = (1, amount, amount, amount) if c is None else (
                c[0] + 1, max(c[1], amount), min(c[2], amount), c[3] + amount)
            touched.add(user)
        for user in touched:
            n, high, low, total = totals[user]
            out.append((user, json.dumps({"count": n, "max": high, "min": low, "sum": total, "user": user},
                                         sort_keys=True)))
    return out
