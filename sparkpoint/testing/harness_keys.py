"""Key groups as a job assigns them, without Spark.

A job puts each row in key group `pmod(xxhash64(key columns), max_parallelism)`,
computed by Spark (runtime/stage.py). The tester computes the same function in
Python, so a key lands in the key group it would have in a job: state is laid out
in the store exactly as the job lays it out, and whatever depends on key-group
order (a `KeyedAggregate` emits its keys in store order) comes out in the job's
order. Spark's XXH64 (seed 42, each column's hash the next column's seed, nulls
skipped) is the standard XXH64 over each value's Spark representation.
"""

from __future__ import annotations

import struct
import zlib

import pyarrow as pa
import xxhash

SPARK_SEED = 42


def xxh64(data: bytes, seed: int) -> int:
    """XXH64 of `data` (unsigned 64-bit result); Spark chains column hashes through
    the seed, and a chained seed may be any 64-bit value."""
    return xxhash.xxh64_intdigest(data, seed=seed & 0xFFFFFFFFFFFFFFFF)


def _spark_bytes(value, t: pa.DataType) -> bytes | None:
    """The bytes Spark's XXH64 hashes for one value of Arrow type `t` (None: Spark
    has no representation here that this module knows)."""
    if pa.types.is_boolean(t):
        return struct.pack("<i", 1 if value else 0)
    if pa.types.is_integer(t):
        return struct.pack("<i", value) if t.bit_width <= 32 else struct.pack("<q", value)
    if pa.types.is_float32(t):
        return struct.pack("<f", 0.0 if value == 0 else value)  # Spark hashes -0.0 as 0.0
    if pa.types.is_float64(t):
        return struct.pack("<d", 0.0 if value == 0 else value)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return value.encode("utf-8")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return bytes(value)
    if pa.types.is_date32(t):
        return struct.pack("<i", value)
    if pa.types.is_timestamp(t):  # `value` counts t.unit; Spark's TIMESTAMP counts microseconds
        micros = {"s": value * 1_000_000, "ms": value * 1_000, "us": value, "ns": value // 1_000}[t.unit]
        return struct.pack("<q", micros)
    return None


def key_groups(rows: pa.Table, key_columns: list[str], max_parallelism: int) -> pa.Array:
    """`pmod(xxhash64(key columns), max_parallelism)` per row, as Spark computes it."""
    columns = []
    for c in key_columns:
        col = rows.column(c)
        raw = col.cast(pa.int64()) if pa.types.is_timestamp(col.type) else \
            col.cast(pa.int32()) if pa.types.is_date32(col.type) else col
        columns.append((raw.to_pylist(), col.type))
    groups = []
    for i in range(rows.num_rows):
        h = SPARK_SEED
        for values, t in columns:
            v = values[i]
            if v is None:
                continue  # Spark leaves the seed as it is for a null
            raw = _spark_bytes(v, t)
            if raw is None:  # a type only the job's Spark can hash: any stable group works
                raw = repr(v).encode()
                h = zlib.crc32(raw, h & 0xFFFFFFFF)
                continue
            h = xxh64(raw, h)
        signed = h - (1 << 64) if h >= 1 << 63 else h
        groups.append(signed % max_parallelism)  # Python's % is Spark's pmod for a positive divisor
    return pa.array(groups, pa.int32())
