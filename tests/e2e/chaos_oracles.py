"""What the chaos tests' pipelines must commit, computed from their input alone (batch,
no sparkpoint, no Spark): a failure-free reference job would cost a Spark start and the
whole input again, and could share a bug with the job it checks.

- windows: GeneratorSource events into tumbling event-time windows. Record n of split s
  is event g = n * splits + s; its key, value and event time are Spark SQL's xxhash64
  of g (GeneratorSource._slice_sql), recomputed here. Valid while no event is late
  (disorder below the watermark delay), when the windows do not depend on epochs.
"""

from __future__ import annotations

import struct


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
