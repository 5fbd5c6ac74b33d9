"""Byte layout of every key in a subtask's RocksDB store.

    <key group: 2 bytes BE> <namespace: 1-byte length + UTF-8 name> <user key> [<suffix>]

The key group comes first so that a later rescale can hand a contiguous key-group
range to another subtask with one range scan / SST split per range (Flink's layout).
Store metadata (format, epoch marker, last output, operator counters) lives under the
reserved group 0xFFFF, which no real key group can reach (max parallelism <= 32768).

User keys (the values of the operator's key columns) are encoded column by column as
`<tag byte><payload>` with a tag of 0 for null. Integers and timestamps are 8-byte
big-endian with the sign bit flipped, strings/binaries carry a 4-byte length: the
code is prefix-free, so `<group><namespace><user key>` is a safe scan prefix for
everything stored under one key (map entries, list elements), and integer keys sort
numerically.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAX_KEY_GROUPS = 32768
META_PREFIX = b"\xff\xff"
_SIGN = np.uint64(1 << 63)
_EMPTY = pa.scalar(b"", pa.binary())


def key_group_range(subtask: int, parallelism: int, max_parallelism: int) -> range:
    """The key groups subtask `subtask` owns, matching the runtime's
    `__subtask = __kg * parallelism // max_parallelism`."""
    if not 0 < parallelism <= max_parallelism <= MAX_KEY_GROUPS:
        raise ValueError(f"need 0 < parallelism ({parallelism}) <= max_parallelism "
                         f"({max_parallelism}) <= {MAX_KEY_GROUPS}")
    start = -(-subtask * max_parallelism // parallelism)
    stop = -(-(subtask + 1) * max_parallelism // parallelism)
    return range(start, stop)


def namespace(name: str) -> bytes:
    raw = name.encode("utf-8")
    if not 0 < len(raw) < 256:
        raise ValueError(f"state name {name!r} must be 1..255 UTF-8 bytes")
    return bytes([len(raw)]) + raw


def group_prefix(key_group: int, ns: bytes) -> bytes:
    _check_group(key_group)
    return key_group.to_bytes(2, "big") + ns


def meta_key(name: str) -> bytes:
    return META_PREFIX + b"meta/" + name.encode("utf-8")


def encode_timestamp(ts: int) -> bytes:
    """Order-preserving 8 bytes for a signed 64-bit integer."""
    return ((int(ts) + (1 << 63)) & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "big")


def decode_timestamp(raw: bytes) -> int:
    return int.from_bytes(raw[:8], "big") - (1 << 63)


def encode_user_key(values: tuple, types: list[pa.DataType]) -> bytes:
    """One key; produces exactly the bytes `encode_user_keys` produces for that row."""
    table = pa.table({f"k{i}": pa.array([v], type=t) for i, (v, t) in enumerate(zip(values, types))})
    return encode_user_keys(table, list(table.column_names))[0]


def encode_user_keys(table: pa.Table, key_columns: list[str]) -> list[bytes]:
    return _join(_user_key_parts(table, key_columns), table.num_rows)


def encode_state_keys(table: pa.Table, key_columns: list[str], key_group_column: str, ns: bytes,
                      suffix_column: str | None = None) -> list[bytes]:
    """Full store keys for every row: group + namespace + user key [+ 8-byte int suffix]."""
    return _join(_state_key_parts(table, key_columns, key_group_column, ns, suffix_column), table.num_rows)


def encode_state_key_array(table: pa.Table, key_columns: list[str], key_group_column: str, ns: bytes,
                           suffix_column: str | None = None) -> pa.Array:
    """`encode_state_keys` as one Arrow binary array (no Python object per key): Arrow
    sorts it in the store's byte order (`pc.sort_indices`)."""
    return _join_array(_state_key_parts(table, key_columns, key_group_column, ns, suffix_column), table.num_rows)


def _state_key_parts(table: pa.Table, key_columns: list[str], key_group_column: str, ns: bytes,
                     suffix_column: str | None) -> list[pa.Array]:
    n = table.num_rows
    groups = table.column(key_group_column).to_numpy(zero_copy_only=False).astype(np.int64)
    if n and (groups.min() < 0 or groups.max() >= MAX_KEY_GROUPS):
        raise ValueError(f"column {key_group_column} holds key groups outside 0..{MAX_KEY_GROUPS - 1}")
    prefix = np.empty((n, 2 + len(ns)), dtype=np.uint8)
    prefix[:, :2] = groups.astype(">u2").view(np.uint8).reshape(n, 2)
    prefix[:, 2:] = np.frombuffer(ns, dtype=np.uint8)
    parts = [_fixed(prefix.tobytes(), 2 + len(ns), n), *_user_key_parts(table, key_columns)]
    if suffix_column is not None:
        parts.append(_int_bytes(table.column(suffix_column), n))
    return parts


# -- internals --------------------------------------------------------------------------
def _check_group(key_group: int) -> None:
    if not 0 <= key_group < MAX_KEY_GROUPS:
        raise ValueError(f"key group {key_group} outside 0..{MAX_KEY_GROUPS - 1}")


def _fixed(data: bytes, width: int, n: int) -> pa.Array:
    arr = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, pa.py_buffer(data)])
    return arr.cast(pa.binary())


def _int_bytes(col: pa.ChunkedArray | pa.Array, n: int) -> pa.Array:
    ints = pc.fill_null(col.cast(pa.int64()), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return _fixed((ints.view(np.uint64) ^ _SIGN).astype(">u8").tobytes(), 8, n)


def _user_key_parts(table: pa.Table, key_columns: list[str]) -> list[pa.Array]:
    n = table.num_rows
    parts: list[pa.Array] = []
    for name in key_columns:
        col = table.column(name).combine_chunks()
        typ = col.type
        tag = pc.if_else(pc.is_valid(col), pa.scalar(b"\x01", pa.binary()), pa.scalar(b"\x00", pa.binary()))
        parts.append(tag)
        if pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_binary(typ) \
                or pa.types.is_large_binary(typ):
            data = pc.fill_null(col.cast(pa.binary()), b"")
            lengths = pc.binary_length(data).to_numpy(zero_copy_only=False).astype(">u4")
            parts += [_fixed(lengths.tobytes(), 4, n), data]
        elif pa.types.is_floating(typ):
            floats = pc.fill_null(col.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
            parts.append(_fixed((floats + 0.0).astype(">f8").tobytes(), 8, n))  # +0.0 folds -0.0
        elif pa.types.is_boolean(typ):
            parts.append(_int_bytes(col.cast(pa.int64()), n))
        elif pa.types.is_integer(typ) or pa.types.is_timestamp(typ) or pa.types.is_date(typ):
            parts.append(_int_bytes(col.cast(pa.int64()) if not pa.types.is_date32(typ)
                                    else col.cast(pa.int32()).cast(pa.int64()), n))
        else:
            raise ValueError(f"key column {name!r} has type {typ}, which cannot be a state key; "
                             "use integer, string, binary, boolean, float, date or timestamp keys")
    return parts


def _join(parts: list[pa.Array], n: int) -> list[bytes]:
    if n == 0:
        return []
    return _join_array(parts, n).to_numpy(zero_copy_only=False).tolist()


def _join_array(parts: list[pa.Array], n: int) -> pa.Array:
    if n == 0:
        return pa.array([], pa.binary())
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*parts, _EMPTY)


def decode_fixed_user_keys(user_keys: pa.Array, fields: list[pa.Field]) -> list[pa.Array] | None:
    """The key columns of encoded user keys, decoded column-wise, when every key column is
    integer-like (integers, booleans, dates, timestamps: 9 bytes each); None otherwise
    (decode those one by one, `key_decode`)."""
    if not decodes_column_wise(fields):
        return None
    n, width = len(user_keys), 9 * len(fields)
    if n == 0:
        return [pa.array([], type=f.type) for f in fields]
    fixed = user_keys.cast(pa.binary(width))
    raw = np.frombuffer(fixed.buffers()[1], dtype=np.uint8, count=n * width,
                        offset=fixed.offset * width).reshape(n, width)
    columns = []
    for i, f in enumerate(fields):
        payload = np.ascontiguousarray(raw[:, 9 * i + 1:9 * i + 9]).view(">u8").reshape(n)
        ints = pa.array((payload ^ _SIGN).astype(np.int64), mask=raw[:, 9 * i] == 0)
        typ = f.type
        if pa.types.is_date32(typ):
            ints = ints.cast(pa.int32())
        columns.append(ints.cast(typ))
    return columns


def decodes_column_wise(fields: list[pa.Field]) -> bool:
    """Whether `decode_fixed_user_keys` decodes keys of these columns."""
    return all(pa.types.is_integer(f.type) or pa.types.is_boolean(f.type) or pa.types.is_date(f.type)
               or pa.types.is_timestamp(f.type) for f in fields)


# -- key values as plain Python (msgpack-able) and back ---------------------------------
def _is_temporal(t: pa.DataType) -> bool:
    return pa.types.is_timestamp(t) or pa.types.is_date(t)


def plain_key_tuples(table: pa.Table, key_columns: list[str]) -> list[tuple]:
    """Key values per row as msgpack-able tuples (timestamps/dates as integers)."""
    cols = []
    for name in key_columns:
        col = table.column(name)
        if _is_temporal(col.type):
            col = col.cast(pa.int32() if pa.types.is_date32(col.type) else pa.int64())
        cols.append(col.to_pylist())
    return list(zip(*cols)) if cols else []


def key_columns_from_plain(tuples: list[tuple], fields: list[pa.Field]) -> list[pa.Array]:
    """Inverse of `plain_key_tuples` for the given key fields."""
    arrays = []
    for i, f in enumerate(fields):
        values = [t[i] for t in tuples]
        if _is_temporal(f.type):
            raw = pa.int32() if pa.types.is_date32(f.type) else pa.int64()
            arrays.append(pa.array(values, type=raw).cast(f.type))
        else:
            arrays.append(pa.array(values, type=f.type))
    return arrays
