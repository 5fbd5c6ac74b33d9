"""Window state shared by the window kinds: one fixed-width record per window and one
entry per window in a due index keyed by time.

    <group><ns><user key><suffix>            -> start, end, count, nvalues, sum, min, max, fired, late
    <group><ns-due><due><user key><suffix>   -> the key values (msgpack of plain values)
    <group><ns-parts><user key><suffix>      -> SQL aggregates' partials (aggfuncs/rows.py)

`suffix` tells a key's windows apart: the window end for sliding and cumulate windows
(cumulate windows of one period share their start), the session start for sessions.
Every window has exactly one due entry, at the time its next action is due:
  - final mode, not fired yet: at its end (fire: emit it);
  - fired, or update mode:     at end + allowed lateness (clean up: delete it).
A window that gets rows after it fired becomes unfired again (its due entry moves back
to its end, which the watermark has passed), so the same epoch re-fires it. Firing and
clean-up are one range scan per key group over the due index up to the watermark,
never a scan of all windows. Everything is in the store under the operator's key
groups: snapshots, restores and rescales carry it like any keyed state; the key values
are msgpack (plain values), nothing is pickled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api import event_time
from sparkpoint.api.aggfuncs import rows as stored_parts
from sparkpoint.api.aggregate import KeySchema
from sparkpoint.api.windows.aggs import WindowAggregates
from sparkpoint.state.codec import FixedWidthCodec
from sparkpoint.state.keys import decode_timestamp, encode_timestamp, group_prefix, key_columns_from_plain, namespace
from sparkpoint.state.stored import StoredCounter

FINAL, UPDATE = "final", "update"
OUTPUT_MODES = (FINAL, UPDATE)
WINDOW_START, WINDOW_END = "window_start", "window_end"
LATE = "late"
_DROPPED = StoredCounter("dropped")


@dataclass
class Windows:
    """A batch of windows: key group, encoded user key, suffix, key values, record."""

    groups: list[int]
    user_keys: list[bytes]
    suffixes: np.ndarray
    key_values: list[tuple]
    records: np.ndarray
    parts: pa.Table | None = None  # SQL aggregates' partials, one row per window

    def take(self, idx: Sequence[int] | np.ndarray) -> "Windows":
        idx = np.asarray(idx, dtype=np.int64)
        return Windows([self.groups[i] for i in idx], [self.user_keys[i] for i in idx], self.suffixes[idx],
                       [self.key_values[i] for i in idx], self.records[idx],
                       None if self.parts is None else self.parts.take(pa.array(idx, pa.int64())))

    def __len__(self) -> int:
        return len(self.groups)


class WindowState:
    def __init__(self, operator: str, keys: KeySchema, aggs: WindowAggregates, allowed_lateness_ms: int,
                 output_mode: str, ns: str):
        self.keys = keys
        self.aggs = aggs
        self.lateness = allowed_lateness_ms
        self.mode = output_mode
        self.codec = FixedWidthCodec(operator, [("start", "i8"), ("end", "i8"), *aggs.record_fields(),
                                                ("fired", "i8"), ("late", "i8")])
        self.ns = namespace(ns)
        self.due_ns = namespace(ns + "-due")
        self.parts_ns = namespace(ns + "-parts")
        self.operator = operator

    def new_records(self, n: int) -> np.ndarray:
        return np.zeros(n, dtype=self.codec.dtype)

    # -- keys -------------------------------------------------------------------------
    def state_keys(self, w: Windows) -> list[bytes]:
        return _join([_groups(w.groups), self.ns, pa.array(w.user_keys, pa.binary()), _timestamps(w.suffixes)])

    def _parts_keys(self, w: Windows) -> list[bytes]:
        return _join([_groups(w.groups), self.parts_ns, pa.array(w.user_keys, pa.binary()), _timestamps(w.suffixes)])

    def read_parts(self, store, w: Windows) -> list[bytes | None]:
        """The stored SQL partials of `w`'s windows (None where there are none)."""
        return store.get_many(self._parts_keys(w))

    def _decode_parts(self, raw: list[bytes]) -> pa.Table:
        return stored_parts.decode_many(raw, self.aggs.sql.part_schema(), self.operator)

    def due_times(self, records: np.ndarray) -> np.ndarray:
        closing = records["end"] + self.lateness
        if self.mode == UPDATE:
            return closing
        return np.where(records["fired"] == 0, records["end"], closing)

    def _due_keys(self, w: Windows, due: np.ndarray) -> list[bytes]:
        return _join([_groups(w.groups), self.due_ns, _timestamps(due), pa.array(w.user_keys, pa.binary()),
                      _timestamps(w.suffixes)])

    # -- reads ------------------------------------------------------------------------
    def read(self, store, w: Windows) -> tuple[np.ndarray, np.ndarray]:
        """The stored records of `w`'s windows, and which exist."""
        stored = store.get_many(self.state_keys(w))
        found = np.fromiter((v is not None for v in stored), dtype=bool, count=len(stored))
        records = self.new_records(len(stored))
        if found.any():
            records[found] = self.codec.decode_many([v for v in stored if v is not None])
        return records, found

    def read_key(self, store, group: int, user_key: bytes) -> tuple[np.ndarray, np.ndarray]:
        """Every stored window of one key: suffixes and records, in suffix order."""
        prefix = group_prefix(group, self.ns) + user_key
        entries = list(store.scan_prefix(prefix))
        suffixes = np.array([decode_timestamp(k[len(prefix):]) for k, _ in entries], dtype=np.int64)
        records = self.codec.decode_many([v for _, v in entries]).copy() if entries else self.new_records(0)
        return suffixes, records

    def read_key_parts(self, store, group: int, user_key: bytes) -> pa.Table:
        """The SQL partials of every stored window of one key, in suffix order (as read_key)."""
        prefix = group_prefix(group, self.parts_ns) + user_key
        return self._decode_parts([v for _, v in store.scan_prefix(prefix)])

    # -- writes -----------------------------------------------------------------------
    def write(self, store, w: Windows, old: np.ndarray | None = None, found: np.ndarray | None = None) -> None:
        """Store `w`'s records; move the due entry of each window whose due time
        changed (`old`/`found`: the records stored before, where there were any)."""
        if not len(w):
            return
        store.put_many(self.state_keys(w), self.codec.encode_many(w.records))
        if w.parts is not None:
            store.put_many(self._parts_keys(w), stored_parts.encode_many(w.parts, self.aggs.sql.part_schema()))
        due = self.due_times(w.records)
        if old is None or found is None:
            moved = np.ones(len(w), dtype=bool)
        else:
            old_due = self.due_times(old)
            moved = ~found | (old_due != due)
            stale = np.flatnonzero(found & moved)
            store.delete_many(self._due_keys(w.take(stale), old_due[stale]))
        idx = np.flatnonzero(moved)
        moving = w.take(idx)
        store.put_many(self._due_keys(moving, due[idx]),
                       [msgpack.packb(list(k), use_bin_type=True) for k in moving.key_values])

    def remove(self, store, w: Windows) -> None:
        """Delete `w`'s windows (records as stored) and their due entries."""
        if len(w):
            store.delete_many(self.state_keys(w) + self._due_keys(w, self.due_times(w.records)))
            if self.aggs.sql is not None:
                store.delete_many(self._parts_keys(w))

    # -- firing and clean-up ------------------------------------------------------------
    def process_due(self, store, groups: range, watermark: int | None) -> Windows:
        """Fire (final mode) and clean up every window due at `watermark` (all of
        them when None: the end of input). Returns the windows fired."""
        found: list[tuple[bytes, bytes]] = []
        for g in groups:
            prefix = group_prefix(g, self.due_ns)
            stop = None if watermark is None else prefix + encode_timestamp(watermark + 1)
            # Collected before any write: a scan sees writes made while it runs, or not.
            found.extend(store.scan_range(prefix, stop) if stop else store.scan_prefix(prefix))
        if not found:
            return Windows([], [], np.zeros(0, np.int64), [], self.new_records(0))
        at = 2 + len(self.due_ns) + 8
        w = Windows([int.from_bytes(k[:2], "big") for k, _ in found], [k[at:-8] for k, _ in found],
                    np.array([decode_timestamp(k[-8:]) for k, _ in found], dtype=np.int64),
                    [tuple(msgpack.unpackb(v, raw=False)) for _, v in found], self.new_records(len(found)))
        keys = self.state_keys(w)
        w.records = self.codec.decode_many(store.get_many(keys)).copy()
        if self.aggs.sql is not None:
            w.parts = self._decode_parts(self.read_parts(store, w))
        store.delete_many([k for k, _ in found])
        fire = (w.records["fired"] == 0) if self.mode == FINAL else np.zeros(len(w), dtype=bool)
        close = np.ones(len(w), dtype=bool) if watermark is None else w.records["end"] + self.lateness <= watermark
        store.delete_many([keys[i] for i in np.flatnonzero(close)])
        if self.aggs.sql is not None:
            store.delete_many(self._parts_keys(w.take(np.flatnonzero(close))))
        kept = np.flatnonzero(~close)  # fired now, kept for late rows until end + lateness
        if len(kept):
            w.records["fired"][kept] = 1
            marked = w.take(kept)
            marked.parts = None  # unchanged: only the record's flag and due entry move
            self.write(store, marked)
        return w.take(np.flatnonzero(fire))

    # -- counters -----------------------------------------------------------------------
    @staticmethod
    def dropped_count(store) -> int:
        return _DROPPED.value(store)

    def count_dropped(self, store, rows: int) -> None:
        _DROPPED.add(store, rows)

    # -- output -------------------------------------------------------------------------
    def output_fields(self, time_kind: str) -> list[pa.Field]:
        bound = event_time.arrow_type(time_kind)
        return [*self.keys.fields(), pa.field(WINDOW_START, bound), pa.field(WINDOW_END, bound),
                *self.aggs.output_fields(), pa.field(LATE, pa.bool_())]

    def rows(self, w: Windows, time_kind: str, late: np.ndarray | None = None) -> pa.Table:
        """Output rows of `w`; `late` overrides the records' late flags."""
        fields = self.output_fields(time_kind)
        if not len(w):
            return pa.schema(fields).empty_table()
        r = w.records
        columns = [*key_columns_from_plain(w.key_values, self.keys.fields()),
                   event_time.arrow_from_ms(r["start"], time_kind), event_time.arrow_from_ms(r["end"], time_kind),
                   *self.aggs.output_columns(r, w.parts),
                   pa.array((r["late"] != 0) if late is None else late, type=pa.bool_())]
        return pa.Table.from_arrays(columns, schema=pa.schema(fields))


# -- keys built column-wise (state/keys.py's layout): an epoch builds ~100k of them ------
def _fixed(raw: bytes, width: int, n: int) -> pa.Array:
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, pa.py_buffer(raw)]).cast(pa.binary())


def _groups(groups: list[int]) -> pa.Array:
    return _fixed(np.asarray(groups, dtype=">u2").tobytes(), 2, len(groups))


def _timestamps(ts: np.ndarray) -> pa.Array:
    """`encode_timestamp` of each value."""
    raw = (np.asarray(ts, dtype=np.int64).view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8").tobytes()
    return _fixed(raw, 8, len(ts))


def _join(parts: list[pa.Array | bytes]) -> list[bytes]:
    if not len(parts[0]):
        return []
    joined = pc.binary_join_element_wise(*[pa.scalar(p, pa.binary()) if isinstance(p, bytes) else p for p in parts],
                                         pa.scalar(b"", pa.binary()))
    return joined.to_numpy(zero_copy_only=False).tolist()
