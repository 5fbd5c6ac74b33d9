"""Stored layout of a `TumblingWindow`'s state: one Arrow table per key group.

    <key group: 2 bytes><namespace "win-table">  ->  an Arrow IPC stream of the group's open windows

Columns: the key columns (in the step's key types), `window_start` (epoch ms, int64),
`count` (int64), `sum` (float64 for a floating value type, else int64) and `fired`
(bool: the window was emitted and waits, within its allowed lateness, for late rows).
One row per (key, window) still held; rows in no particular order. The stream carries
its own schema (a flatbuffer, never a pickle), so a reader needs nothing else to decode
it. The entry sits in its key group, so snapshots, restores and rescales move it with
the group like any keyed state.

Stores written before this layout hold one fixed-width record per (key, window) under
`win`, plus a fire index (`win-fire`) and a clean-up index (`win-cleanup`); the
operator converts a store's own key groups on its first epoch and records that in the
store's metadata under `LAYOUT_META`. The state reader reads both layouts.
"""

from __future__ import annotations

import pyarrow as pa

from sparkpoint.state import arrow_entries

TABLE_NS = "win-table"
OLD_RECORD_NS, OLD_FIRE_NS, OLD_CLEANUP_NS = "win", "win-fire", "win-cleanup"
LAYOUT_META = "window-layout"
LAYOUT = b"tables/1"
# A TumblingWindow with Spark SQL aggregates or an output mode keeps a sliding window's
# state instead (api/windows/tumbling.py); each kind refuses a store the other wrote.
ENGINE_META = "window-engine"
ENGINE = b"tumbling-on-engine/1"
WINDOW_START, COUNT, SUM, FIRED = "window_start", "count", "sum", "fired"
_LAYOUT = b"tumbling-window-table/1"


def table_schema(key_fields: list[pa.Field], floating_sum: bool) -> pa.Schema:
    # Key fields nullable whatever the input declared, so tables written under either concatenate.
    return pa.schema([*(f.with_nullable(True) for f in key_fields), pa.field(WINDOW_START, pa.int64()), pa.field(COUNT, pa.int64()),
                      pa.field(SUM, pa.float64() if floating_sum else pa.int64()), pa.field(FIRED, pa.bool_())],
                     metadata={arrow_entries.LAYOUT_KEY: _LAYOUT})


def encode(table: pa.Table) -> bytes:
    return arrow_entries.encode(table)


def decode(raw: bytes, where: str) -> pa.Table:
    """The table of one stored entry. Raises StateSchemaError if it is not one."""
    return arrow_entries.decode(raw, where, "a window table entry", "a TumblingWindow", [_LAYOUT])
