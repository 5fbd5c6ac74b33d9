"""The inverse of `sparkpoint.state.keys`: split a stored key back into key group,
namespace, user key values and the suffix that follows them (list sequence number,
map key, timestamp). Used by the state reader, which meets every key of a subtask
without knowing which encoder wrote it.

User key values come back "plain" (timestamps and dates as integers, as
`keys.plain_key_tuples` gives them), so `keys.key_columns_from_plain` turns them into
columns of the declared key types.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa

from sparkpoint.errors import StateSchemaError

_SIGN = 1 << 63


@dataclass(frozen=True)
class StoredKey:
    key_group: int
    namespace: str
    user_key: bytes      # the encoded user key (what the writers scan by)
    values: tuple        # the user key, plain
    suffix: bytes        # whatever follows the user key


def split_namespace(raw: bytes) -> tuple[int, str, int]:
    """(key group, namespace name, offset of the user key) of a stored key."""
    if len(raw) < 3 or len(raw) < 3 + raw[2]:
        raise StateSchemaError(f"stored key {raw[:32].hex()} is shorter than its key group and namespace")
    n = raw[2]
    return int.from_bytes(raw[:2], "big"), raw[3:3 + n].decode("utf-8", "replace"), 3 + n


def decode_user_key(raw: bytes, offset: int, types: list[pa.DataType]) -> tuple[tuple, int]:
    """The plain user key starting at `offset`, and the offset after it. A null value
    still has its payload (the encoder fills nulls before encoding), so lengths hold."""
    values = []
    for t in types:
        if offset >= len(raw):
            raise StateSchemaError(f"stored key {raw[:32].hex()} ends inside its user key; the key "
                                   f"columns {types} do not match the ones the state was written with")
        valid = raw[offset] != 0
        offset += 1
        if _is_bytes(t):
            size = int.from_bytes(raw[offset:offset + 4], "big")
            payload = raw[offset + 4:offset + 4 + size]
            offset += 4 + size
            value = (payload.decode("utf-8") if pa.types.is_string(t) or pa.types.is_large_string(t)
                     else bytes(payload))
        elif pa.types.is_floating(t):
            value = struct.unpack(">d", raw[offset:offset + 8])[0]
            offset += 8
        else:  # integers, booleans, dates, timestamps: sign-flipped big-endian int64
            value = int.from_bytes(raw[offset:offset + 8], "big") - _SIGN
            offset += 8
            if pa.types.is_boolean(t):
                value = value != 0
        if offset > len(raw):
            raise StateSchemaError(f"stored key {raw[:32].hex()} ends inside its user key; the key "
                                   f"columns {types} do not match the ones the state was written with")
        values.append(value if valid else None)
    return tuple(values), offset


def split_key(raw: bytes, types: list[pa.DataType]) -> StoredKey:
    group, ns, start = split_namespace(raw)
    values, end = decode_user_key(raw, start, types)
    return StoredKey(group, ns, raw[start:end], values, raw[end:])


def _is_bytes(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t))
