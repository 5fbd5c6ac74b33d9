"""What the window steps that keep one Arrow table per key group share (sliding and
cumulate panes: pane_table_state.py; sessions: session_table_state.py): the layout a
store keeps for its life, and which key groups an epoch reads."""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import pyarrow as pa

from sparkpoint.api.aggregate import require_key_groups
from sparkpoint.state.interfaces import KEY_GROUP_COL, EpochContext
from sparkpoint.state.keys import group_prefix, key_group_range, namespace


def keeps_tables(store, groups: range, *, layout_meta: str, tables: bytes, records: bytes,
                 records_namespace: str) -> bool:
    """True once per store for the group-table layout; a store that already holds the
    per-window layout's records (under `records_namespace`, in its key `groups`) keeps
    that layout. The choice (`tables` or `records`) is recorded under `layout_meta`, so
    a store never mixes the two."""
    layout = store.get_meta(layout_meta)
    if layout is None:
        ns = namespace(records_namespace)
        layout = records if any(store.has_prefix(group_prefix(g, ns)) for g in groups) else tables
        store.put_meta(layout_meta, layout)
    return layout == tables


class EpochReads(NamedTuple):
    new: pa.Table | None  # the epoch's partials (None: nothing left of the rows)
    touched: set[int]  # the key groups they fall in
    wm: int | None  # the watermark windows fire and close at; None at the end of input or before a watermark
    wanted: list[int]  # the groups whose tables are read: the touched ones, and all when a watermark or the end is due


def epoch_reads(op, rows: pa.Table, ctx: EpochContext,
                partials: Callable[[pa.Table], pa.Table | None]) -> EpochReads:
    """The epoch's partials (`partials` of its rows) and the key groups to read."""
    new = None
    if rows.num_rows:
        require_key_groups(rows, op.name)
        new = partials(rows)
    touched = set() if new is None else set(np.unique(new.column(KEY_GROUP_COL).to_numpy()).tolist())
    wm = None if ctx.final else ctx.watermark_ms
    groups = key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism)
    wanted = sorted(touched | (set(groups) if ctx.final or wm is not None else set()))
    return EpochReads(new, touched, wm, wanted)
