"""Stored layout of a `SlidingWindow`'s state with one-column aggregates: one Arrow
table of panes per key group.

    <key group: 2 bytes><namespace "hop-panes">  ->  an Arrow IPC stream of the group's panes

Columns: the key columns (in the step's key types), `pane_start` (epoch ms, int64),
`count` (int64) and, when the step aggregates a value column, `nvalues` (int64),
`sum`, `min`, `max` (float64 for a floating value type, else int64; min/max hold
their identities where a pane has no value). One row per (key, pane) still needed by
a window that may fire again. The schema metadata carries `fired_through`: the
watermark up to which the group's windows have fired (a window with data and
end <= fired_through fired), and the window shape (`size_ms`, `slide_ms`,
`allowed_lateness_ms`, `output_mode`), so a reader needs nothing else. The stream
carries its own schema (a flatbuffer, never a pickle). The entry sits in its key
group, so snapshots, restores and rescales move it with the group.

A store keeps one layout for its life: `LAYOUT_META` records `PANES` or, for a store
that already held the per-window layout (sparkpoint/api/windows/state.py) when this
layout arrived, `WINDOWS`; such a store stays on the per-window layout.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from sparkpoint.errors import StateSchemaError

PANE_NS = "hop-panes"
LAYOUT_META = "sliding-layout"
PANES, WINDOWS = b"panes/1", b"windows/1"
PANE_START, COUNT, NVALUES, SUM, MIN, MAX = "pane_start", "count", "nvalues", "sum", "min", "max"
WINDOW_START, WINDOW_END, FIRED = "window_start", "window_end", "fired"
FIRED_THROUGH = b"fired_through"
NEVER = -(1 << 63)  # fired_through of a group no watermark has reached
_LAYOUT_KEY, _LAYOUT = b"sparkpoint.layout", b"sliding-pane-table/1"
_OPTIONS = pa.ipc.IpcWriteOptions()  # given, so a writer does not look up its defaults in the environment


def table_schema(key_fields: list[pa.Field], value_type: pa.DataType | None) -> pa.Schema:
    """`value_type` None: count only (no value column)."""
    fields = [*(f.with_nullable(True) for f in key_fields), pa.field(PANE_START, pa.int64()),
              pa.field(COUNT, pa.int64())]
    if value_type is not None:
        fields += [pa.field(NVALUES, pa.int64()), pa.field(SUM, value_type), pa.field(MIN, value_type),
                   pa.field(MAX, value_type)]
    return pa.schema(fields)


def shape_metadata(size_ms: int, slide_ms: int, lateness_ms: int, output_mode: str) -> dict[bytes, bytes]:
    return {_LAYOUT_KEY: _LAYOUT, b"size_ms": str(size_ms).encode(), b"slide_ms": str(slide_ms).encode(),
            b"allowed_lateness_ms": str(lateness_ms).encode(), b"output_mode": output_mode.encode()}


def encode(table: pa.Table, shape: dict[bytes, bytes], fired_through: int) -> bytes:
    table = table.replace_schema_metadata({**shape, FIRED_THROUGH: str(fired_through).encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_OPTIONS) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode(raw: bytes, where: str) -> tuple[pa.Table, int]:
    """The panes of one stored entry and its `fired_through`. Raises StateSchemaError if
    it is not one."""
    try:
        with pa.ipc.open_stream(pa.py_buffer(raw)) as reader:
            table = reader.read_all()
    except pa.ArrowInvalid as e:
        raise StateSchemaError(f"{where}: a pane table entry is not an Arrow IPC stream ({e}); the state was not "
                               "written by a SlidingWindow of this version") from e
    meta = table.schema.metadata or {}
    if meta.get(_LAYOUT_KEY) != _LAYOUT:
        raise StateSchemaError(f"{where}: a pane table entry has the layout {meta.get(_LAYOUT_KEY)!r}, not "
                               f"{_LAYOUT!r}; read it with the sparkpoint version that wrote it")
    return table, int(meta[FIRED_THROUGH])


def shape(table: pa.Table) -> tuple[int, int, int, str]:
    """(size_ms, slide_ms, allowed_lateness_ms, output_mode) recorded in a decoded table."""
    meta = table.schema.metadata or {}
    return (int(meta[b"size_ms"]), int(meta[b"slide_ms"]), int(meta[b"allowed_lateness_ms"]),
            meta[b"output_mode"].decode())


def windows_held(table: pa.Table, fired_through: int) -> pa.Table:
    """The windows a decoded group table holds, as the per-window layout kept them: the
    key columns, window_start, window_end, the totals summed over each window's panes,
    and fired (final mode: the watermark passed the window's end). Windows closed
    (end + allowed lateness <= fired_through) are left out."""
    size, slide, lateness, mode = shape(table)
    pane = math.gcd(size, slide)
    panes = table.column(PANE_START).to_numpy()
    first = -((size - pane - panes) // slide)
    n = np.maximum(panes // slide - first + 1, 0)
    which = np.repeat(np.arange(len(panes)), n)
    starts = (first[which] + np.arange(len(which)) - np.repeat(np.cumsum(n) - n, n)) * slide
    keep = starts + size + lateness > fired_through
    totals = [c for c in (COUNT, NVALUES, SUM, MIN, MAX) if c in table.column_names]
    keys = [c for c in table.column_names if c not in (PANE_START, *totals)]
    pairs = table.select([*keys, *totals]).take(pa.array(which[keep])) \
        .append_column(WINDOW_START, pa.array(starts[keep], pa.int64()))
    combine = {COUNT: "sum", NVALUES: "sum", SUM: "sum", MIN: "min", MAX: "max"}
    windows = pairs.group_by([*keys, WINDOW_START], use_threads=False).aggregate([(c, combine[c]) for c in totals])
    windows = windows.rename_columns({f"{c}_{combine[c]}": c for c in totals})
    ends = windows.column(WINDOW_START).to_numpy() + size
    fired = (ends <= fired_through) if mode == "final" else np.zeros(len(ends), dtype=bool)
    return windows.append_column(WINDOW_END, pa.array(ends, pa.int64())).append_column(FIRED, pa.array(fired))
