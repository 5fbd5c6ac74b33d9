"""Stored layout of a `SessionWindow`'s state with one-column aggregates: one Arrow
table of open sessions per key group.

    <key group: 2 bytes><namespace "session-tables">  ->  an Arrow IPC stream of the group's sessions

Columns: the key columns (in the step's key types), `start` and `end` (the session's
bounds, epoch ms, int64), `count` (int64) and, when the step aggregates a value
column, `nvalues` (int64), `sum`, `min`, `max` (float64 for a floating value type,
else int64; min/max hold their identities where a session has no value), then
`fired` (final mode: the session was emitted when the watermark reached its end) and
`late` (rows behind the watermark went into it: it fires marked late). One row per
session still open to rows (end + allowed lateness > the watermark). The schema
metadata carries the step's shape (`allowed_lateness_ms`, `output_mode`), so a reader
needs nothing else. The stream carries its own schema (a flatbuffer, never a pickle).
The entry sits in its key group, so snapshots, restores and rescales move it with the
group.

A store keeps one layout for its life: `LAYOUT_META` records `TABLES` or, for a store
that already held the per-session layout (sparkpoint/api/windows/state.py) when this
layout arrived, `SESSIONS`; such a store stays on the per-session layout.
"""

from __future__ import annotations

import pyarrow as pa

from sparkpoint.state import arrow_entries

SESSION_NS = "session-tables"
LAYOUT_META = "session-layout"
TABLES, SESSIONS = b"tables/1", b"sessions/1"
START, END, COUNT, NVALUES, SUM, MIN, MAX, FIRED, LATE = (
    "start", "end", "count", "nvalues", "sum", "min", "max", "fired", "late")
_LAYOUT = b"session-table/1"


def table_schema(key_fields: list[pa.Field], value_type: pa.DataType | None) -> pa.Schema:
    """`value_type` None: count only (no value column)."""
    fields = [*(f.with_nullable(True) for f in key_fields), pa.field(START, pa.int64()), pa.field(END, pa.int64()),
              pa.field(COUNT, pa.int64())]
    if value_type is not None:
        fields += [pa.field(NVALUES, pa.int64()), pa.field(SUM, value_type), pa.field(MIN, value_type),
                   pa.field(MAX, value_type)]
    return pa.schema([*fields, pa.field(FIRED, pa.bool_()), pa.field(LATE, pa.bool_())])


def shape_metadata(lateness_ms: int, output_mode: str) -> dict[bytes, bytes]:
    return {arrow_entries.LAYOUT_KEY: _LAYOUT, b"allowed_lateness_ms": str(lateness_ms).encode(),
            b"output_mode": output_mode.encode()}


def encode(table: pa.Table, shape: dict[bytes, bytes]) -> bytes:
    return arrow_entries.encode(table.replace_schema_metadata(shape))


def decode(raw: bytes, where: str) -> pa.Table:
    """The sessions of one stored entry. Raises StateSchemaError if it is not one."""
    return arrow_entries.decode(raw, where, "a session table entry", "a SessionWindow", [_LAYOUT])


def shape(table: pa.Table) -> tuple[int, str]:
    """(allowed_lateness_ms, output_mode) recorded in a decoded table."""
    meta = table.schema.metadata or {}
    return int(meta[b"allowed_lateness_ms"]), meta[b"output_mode"].decode()
