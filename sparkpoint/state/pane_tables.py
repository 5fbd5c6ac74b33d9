"""Stored layout of a `SlidingWindow`'s or `CumulateWindow`'s state with one-column
aggregates: one Arrow table of panes per key group.

    <key group: 2 bytes><namespace "hop-panes" | "cumulate-panes">  ->  an Arrow IPC stream of the group's panes

Columns: the key columns (in the step's key types), `pane_start` (epoch ms, int64),
`count` (int64) and, when the step aggregates a value column, `nvalues` (int64),
`sum`, `min`, `max` (float64 for a floating value type, else int64; min/max hold
their identities where a pane has no value). One row per (key, pane) still needed by
a window that may fire again. The schema metadata carries `fired_through`: the
watermark up to which the group's windows have fired (a window with data and
end <= fired_through fired), the layout tag (which window kind wrote it) and the
window shape (`size_ms`, `slide_ms` or `step_ms`, `allowed_lateness_ms`,
`output_mode`), so a reader needs nothing else. The stream
carries its own schema (a flatbuffer, never a pickle). The entry sits in its key
group, so snapshots, restores and rescales move it with the group.

A store keeps one layout for its life: the kind's `layout_meta` records `PANES` or, for
a store that already held the per-window layout (sparkpoint/api/windows/state.py) when
this layout arrived, `WINDOWS`; such a store stays on the per-window layout. Each kind
has its own namespace and meta key, so a sliding and a cumulate step never read each
other's entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sparkpoint.state import arrow_entries



@dataclass(frozen=True)
class Kind:
    """Where one window kind keeps its pane tables and how its entries are tagged."""
    window_kind: str  # as the state descriptor names it
    namespace: str  # of the group entries
    layout_meta: str  # the store metadata key recording PANES or WINDOWS
    layout: bytes  # the tag in each entry's schema metadata
    length: bytes  # the metadata key of the window's second length (the first is size_ms)


SLIDING = Kind("sliding", "hop-panes", "sliding-layout", b"sliding-pane-table/1", b"slide_ms")
CUMULATE = Kind("cumulate", "cumulate-panes", "cumulate-layout", b"cumulate-pane-table/1", b"step_ms")
_KINDS = {k.layout: k for k in (SLIDING, CUMULATE)}
PANES, WINDOWS = b"panes/1", b"windows/1"
PANE_START, COUNT, NVALUES, SUM, MIN, MAX = "pane_start", "count", "nvalues", "sum", "min", "max"
WINDOW_START, WINDOW_END, FIRED = "window_start", "window_end", "fired"
FIRED_THROUGH = b"fired_through"
NEVER = -(1 << 63)  # fired_through of a group no watermark has reached
_LAYOUT_KEY = arrow_entries.LAYOUT_KEY


def table_schema(key_fields: list[pa.Field], value_type: pa.DataType | None) -> pa.Schema:
    """`value_type` None: count only (no value column)."""
    fields = [*(f.with_nullable(True) for f in key_fields), pa.field(PANE_START, pa.int64()),
              pa.field(COUNT, pa.int64())]
    if value_type is not None:
        fields += [pa.field(NVALUES, pa.int64()), pa.field(SUM, value_type), pa.field(MIN, value_type),
                   pa.field(MAX, value_type)]
    return pa.schema(fields)


def holds_panes(namespace: str, window_kind: str) -> bool:
    """Whether entries of `namespace` are the pane tables of a `window_kind` step."""
    return any(k.namespace == namespace and k.window_kind == window_kind for k in _KINDS.values())


def shape_metadata(kind: Kind, size_ms: int, length_ms: int, lateness_ms: int,
                   output_mode: str) -> dict[bytes, bytes]:
    """`length_ms`: the slide (sliding) or the step (cumulate)."""
    return {_LAYOUT_KEY: kind.layout, b"size_ms": str(size_ms).encode(), kind.length: str(length_ms).encode(),
            b"allowed_lateness_ms": str(lateness_ms).encode(), b"output_mode": output_mode.encode()}


def encode(table: pa.Table, shape: dict[bytes, bytes], fired_through: int) -> bytes:
    return arrow_entries.encode(table.replace_schema_metadata({**shape, FIRED_THROUGH: str(fired_through).encode()}))


def decode(raw: bytes, where: str) -> tuple[pa.Table, int]:
    """The panes of one stored entry and its `fired_through`. Raises StateSchemaError if
    it is not one."""
    table = arrow_entries.decode(raw, where, "a pane table entry", "a sliding or cumulate window", _KINDS.keys())
    return table, int(table.schema.metadata[FIRED_THROUGH])


def kind(table: pa.Table) -> Kind:
    """The window kind that wrote a decoded table."""
    return _KINDS[table.schema.metadata[_LAYOUT_KEY]]


def shape(table: pa.Table) -> tuple[int, int, int, str]:
    """(size_ms, slide_ms or step_ms, allowed_lateness_ms, output_mode) recorded in a
    decoded table."""
    meta = table.schema.metadata or {}
    return (int(meta[b"size_ms"]), int(meta[kind(table).length]), int(meta[b"allowed_lateness_ms"]),
            meta[b"output_mode"].decode())


def _windows_of(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row of the pane, window start, window end), one entry per window a stored pane
    lies in, as the operator's `assign` gives them."""
    size, length, _, _ = shape(table)
    panes = table.column(PANE_START).to_numpy()
    if kind(table) is SLIDING:
        pane = math.gcd(size, length)
        first = -((size - pane - panes) // length)
        n = np.maximum(panes // length - first + 1, 0)
    else:  # cumulate: from the pane's own step to the end of its period
        period = panes - np.mod(panes, size)
        first = (panes - period) // length + 1
        n = size // length - first + 1
    which = np.repeat(np.arange(len(panes)), n)
    k = first[which] + np.arange(len(which)) - np.repeat(np.cumsum(n) - n, n)
    if kind(table) is SLIDING:
        return which, k * length, k * length + size
    return which, period[which], period[which] + k * length


def windows_held(table: pa.Table, fired_through: int) -> pa.Table:
    """The windows a decoded group table holds, as the per-window layout kept them: the
    key columns, window_start, window_end, the totals summed over each window's panes,
    and fired (final mode: the watermark passed the window's end). Windows closed
    (end + allowed lateness <= fired_through) are left out."""
    _, _, lateness, mode = shape(table)
    which, starts, ends = _windows_of(table)
    keep = ends + lateness > fired_through
    totals = [c for c in (COUNT, NVALUES, SUM, MIN, MAX) if c in table.column_names]
    keys = [c for c in table.column_names if c not in (PANE_START, *totals)]
    pairs = table.select([*keys, *totals]).take(pa.array(which[keep])) \
        .append_column(WINDOW_START, pa.array(starts[keep], pa.int64())) \
        .append_column(WINDOW_END, pa.array(ends[keep], pa.int64()))
    combine = {COUNT: "sum", NVALUES: "sum", SUM: "sum", MIN: "min", MAX: "max"}
    windows = pairs.group_by([*keys, WINDOW_START, WINDOW_END], use_threads=False) \
        .aggregate([(c, combine[c]) for c in totals])
    windows = windows.rename_columns({f"{c}_{combine[c]}": c for c in totals})
    windows = windows.select([*keys, WINDOW_START, WINDOW_END, *totals])
    ends = windows.column(WINDOW_END).to_numpy()
    fired = (ends <= fired_through) if mode == "final" else np.zeros(len(ends), dtype=bool)
    return windows.append_column(FIRED, pa.array(fired))
