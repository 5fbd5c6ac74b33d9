"""Time to live of processor state values, as Spark's transformWithState and Flink's
StateTtlConfig keep it: processing time, an expiry set on every write, expired values
invisible at once and removed from the store at the end of the epoch.

A value written with a TTL is stored as

    <TTL_MARK: 1 byte> <expiry ms: 8 bytes, big-endian signed> <the encoded value>

and indexed by its expiry, so the clean-up reads only what is due:

    <group><"~ttl"><expiry: 8, order-preserving><the value's stored key after its group> -> b""

A value is expired once the processing time reaches its expiry (Spark: the batch time
>= the expiry). A write leaves the old index entry behind; when that entry comes due,
the value it points at carries another expiry (or is gone), so only the entry is
removed. A value keeps the expiry it was written with even if a later version of the
processor declares the state without a TTL; plain values (no mark) never expire.
"""

from __future__ import annotations

from typing import Iterable

from sparkpoint.state.keys import encode_timestamp, group_prefix, namespace

TTL_MARK = 0xE7  # never a codec version byte (sparkpoint.state.codec.CODEC_VERSION)
_HEADER = 9
NS_TTL = namespace("~ttl")
_LIST_SEQ = 8  # a list element's key ends in its 8-byte sequence number (sparkpoint.api.processor)


def wrap(value: bytes, expiry_ms: int) -> bytes:
    return bytes([TTL_MARK]) + int(expiry_ms).to_bytes(8, "big", signed=True) + value


def expiry_of(raw: bytes) -> int | None:
    """The expiry a stored value carries, or None (it never expires)."""
    if len(raw) >= _HEADER and raw[0] == TTL_MARK:
        return int.from_bytes(raw[1:_HEADER], "big", signed=True)
    return None


def unwrap(raw: bytes) -> bytes:
    """The encoded value inside a stored one, with or without an expiry."""
    return raw[_HEADER:] if expiry_of(raw) is not None else raw


def live(raw: bytes | None, now_ms: int) -> bytes | None:
    """The encoded value of `raw` while it has not expired at `now_ms`, else None."""
    if raw is None:
        return None
    expiry = expiry_of(raw)
    if expiry is None:
        return raw
    return raw[_HEADER:] if now_ms < expiry else None


def index_key(state_key: bytes, expiry_ms: int) -> bytes:
    """The clean-up index entry of the value stored at `state_key` (which starts with its group)."""
    return state_key[:2] + NS_TTL + encode_timestamp(expiry_ms) + state_key[2:]


def purge_expired(store, key_groups: Iterable[int], now_ms: int) -> int:
    """Remove every value of `key_groups` expired at `now_ms`, and its index entry; a
    list left without elements loses its head too (an empty list does not exist).
    Returns how many values were removed."""
    removed = 0
    for group in key_groups:
        prefix = group_prefix(group, NS_TTL)
        due = list(store.scan_range(prefix, prefix + encode_timestamp(now_ms + 1)))
        if not due:
            continue
        heads: set[bytes] = set()
        for entry, _ in due:
            at = len(prefix)
            expiry = int.from_bytes(entry[at:at + 8], "big") - (1 << 63)
            state_key = entry[:2] + entry[at + 8:]
            raw = store.get(state_key)
            if raw is not None and expiry_of(raw) == expiry:
                store.delete(state_key)
                removed += 1
                if _is_list_element(state_key):
                    heads.add(state_key[:-_LIST_SEQ])
        store.delete_many([entry for entry, _ in due])
        for head in heads:
            if not any(k != head for k, _ in _first_two(store.scan_prefix(head))):
                store.delete(head)
    return removed


def _is_list_element(state_key: bytes) -> bool:
    ns_len = state_key[2]
    return state_key[3:3 + ns_len].startswith(b"list:")


def _first_two(entries):
    for i, entry in enumerate(entries):
        yield entry
        if i == 1:
            return
