"""A `SlidingWindow` or `CumulateWindow` with one-column aggregates (count, sum, min,
max, avg) kept as one Arrow table of panes per key group
(sparkpoint/state/pane_tables.py), the way `TumblingWindow` keeps its windows
(window.py): no per-window records, no due index.

The window shape comes from the operator: `assign` (the windows each pane lies in),
`last_window_end` (when a pane can go) and `window_ends_in` (whether a group has a
window due), each a few numpy operations per pane without expanding the panes to their
windows, and `window_starts` (a window's start from its end: the end names a key's
window in both kinds, as a cumulate period's windows share their start).

Per epoch with watermark W (`ctx.watermark_ms`) the outcome is the per-window engine's
(base.py), epoch by epoch:
  1. the epoch's pane partials (Spark's, or raw rows combined here) whose every window
     has end + allowed lateness <= W are dropped and counted; the rest are new rows;
  2. the stored panes of the groups that change (new rows, a window due to fire, a pane
     due to be dropped) are read, one get per group, and with the new rows expanded to
     their windows with numpy (`assign`); a pair (new row, window) whose window is
     closed (end + lateness <= W) is left out, as the engine never adds a partial to a
     closed window; one group-by sums each window's pairs;
  3. output: final mode emits a window with end <= W that has not fired
     (end > the group's `fired_through`) or that got new rows (a late re-fire); update
     mode emits every window that got new rows; `late` marks windows with end <= W that
     got new rows; `ctx.final` emits every window not fired and deletes all state;
  4. clean up: a pane is dropped once the last window holding it has
     end + lateness <= W; each changed group's panes, merged with the new rows, are
     written back whole with fired_through = W.
A group left unread keeps its older fired_through: it was not due, so no window with
data ends (or closes) between that and W, and end > fired_through still means "not
fired" (end + lateness > fired_through: "held").
Float sums may differ from the engine's in the last bits: they are added in another
order (by pane, then by window).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from sparkpoint.api import event_time
from sparkpoint.api.aggregate import P_COUNT, P_MAX, P_MIN, P_NVALUES, P_SUM
from sparkpoint.api.windows.group_tables import epoch_reads, keeps_tables
from sparkpoint.api.windows.panes import P_PANE
from sparkpoint.api.windows.state import FINAL, WINDOW_START, WINDOW_END
from sparkpoint.state import pane_tables as tables
from sparkpoint.state.interfaces import KEY_GROUP_COL, EpochContext
from sparkpoint.state.keys import group_prefix, namespace

_NEW, _FIRED_THROUGH, _END = "__new", "__fired_through", "__end"
_PARTIAL_OF = {tables.COUNT: P_COUNT, tables.NVALUES: P_NVALUES, tables.SUM: P_SUM, tables.MIN: P_MIN,
               tables.MAX: P_MAX}
_COMBINE = {tables.COUNT: "sum", tables.NVALUES: "sum", tables.SUM: "sum", tables.MIN: "min", tables.MAX: "max"}


class PaneTables:
    def __init__(self, op):
        self.op = op
        self.lateness = op.allowed_lateness_ms
        self.ns = namespace(op.pane_table_kind.namespace)
        aggregated = op.aggregates.value_column is not None
        kind = pa.float64() if op.aggregates.kind == "f8" else pa.int64()
        self.schema = tables.table_schema(op.keys.fields(), kind if aggregated else None)
        self.totals = [n for n in self.schema.names if n in _COMBINE]
        self.shape = op.pane_table_shape()

    @staticmethod
    def uses_tables(op, store, groups: range) -> bool:
        """True once per store for pane tables; a store holding per-window records stays on them."""
        return keeps_tables(store, groups, layout_meta=op.pane_table_kind.layout_meta, tables=tables.PANES,
                            records=tables.WINDOWS, records_namespace=op.state_namespace)

    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        op = self.op
        w = ctx.watermark_ms
        new, touched, wm, wanted = epoch_reads(op, rows, ctx, lambda r: self._partials(store, r, w))
        held, changing, fired_through, stored = self._held(store, wanted, touched, wm, ctx.final)
        if new is not None:
            lut = np.full(max(wanted) + 1, tables.NEVER, dtype=np.int64)
            for g, f in fired_through.items():
                lut[g] = f
            new = new.append_column(_FIRED_THROUGH, pa.array(lut[new.column(KEY_GROUP_COL).to_numpy()]))
            held.append(new)
        if not held:
            return op.output_schema.empty_table()
        work = pa.concat_tables(held)
        out = self._emitted(work, touched, w, wm, ctx.final)
        self._write_back(store, work, new is not None, wm, ctx.final, sorted(changing | touched), stored,
                         fired_through)
        return out.sort_by([(WINDOW_START, "ascending"), (WINDOW_END, "ascending"),
                            *[(k, "ascending") for k in op.key_columns]])

    # -- reading ------------------------------------------------------------------------
    def _partials(self, store, rows: pa.Table, w: int | None) -> pa.Table | None:
        """The epoch's partials, one per (key, pane), in the stored columns; panes none of
        whose windows is open are dropped and counted."""
        op = self.op
        panes = op._pane_partials(rows)
        if w is not None and panes.num_rows:
            gone = op.last_window_end(panes.column(P_PANE).to_numpy()) + self.lateness <= w
            if gone.any():
                op.windows.count_dropped(store, int(panes.column(P_COUNT).to_numpy()[gone].sum()))
                panes = panes.filter(pa.array(~gone))
        if not panes.num_rows:
            return None
        cols = [*op.key_columns, KEY_GROUP_COL, P_PANE, *[_PARTIAL_OF[n] for n in self.totals]]
        table = panes.select(cols).rename_columns([*op.key_columns, KEY_GROUP_COL, tables.PANE_START, *self.totals])
        return self._working(table.cast(self._with_group(self.schema)), True)

    def _held(self, store, wanted: list[int], touched: set[int], wm: int | None,
              final: bool) -> tuple[list[pa.Table], set[int], dict[int, int], set[int]]:
        """The stored panes of the groups that change (with their group, flags), those
        groups, each wanted group's fired_through, and the wanted groups that have a table."""
        raws = store.get_many([group_prefix(g, self.ns) for g in wanted])
        held: list[pa.Table] = []
        changing: set[int] = set()
        fired_through: dict[int, int] = {}
        stored: set[int] = set()
        for g, raw in zip(wanted, raws):
            if raw is None:
                continue
            stored.add(g)
            table, f = tables.decode(raw, f"{type(self.op).__name__} {self.op.name!r}, key group {g}")
            fired_through[g] = f
            if g not in touched and not final and not self._due(table, f, wm):
                continue
            changing.add(g)
            n = table.num_rows
            table = table.select(self.schema.names).replace_schema_metadata(None).cast(self.schema)
            table = table.add_column(len(self.op.key_columns), KEY_GROUP_COL, pa.array(np.full(n, g, np.int32)))
            held.append(self._working(table, False).append_column(_FIRED_THROUGH,
                                                                   pa.array(np.full(n, f, np.int64))))
        return held, changing, fired_through, stored

    def _due(self, table: pa.Table, fired_through: int, wm: int | None) -> bool:
        """A pane to drop, or a window with data that fires or closes at or before `wm`
        but after `fired_through` (so a group's fired_through always tells which of its
        windows fired and which closed, also to the state reader)."""
        if wm is None:
            return False
        panes = table.column(tables.PANE_START).to_numpy()
        if not len(panes):
            return True  # never written so: deleted
        if (self.op.last_window_end(panes) + self.lateness <= wm).any():
            return True
        return self.op.window_ends_in(panes, [(fired_through - after, wm - after) for after in (0, self.lateness)])

    # -- firing -------------------------------------------------------------------------
    def _emitted(self, work: pa.Table, touched: set[int], w: int | None, wm: int | None, final: bool) -> pa.Table:
        op = self.op
        final_mode = op.output_mode == FINAL
        if final_mode and wm is None and not final:
            return op.output_schema.empty_table()  # nothing fires before a watermark
        which, _, ends = op.assign(work.column(tables.PANE_START).to_numpy())
        is_new = work.column(_NEW).to_numpy(zero_copy_only=False)[which]
        fired_through = work.column(_FIRED_THROUGH).to_numpy()[which]
        keep = np.ones(len(which), dtype=bool)
        if w is not None:
            keep &= ~(is_new & (ends + self.lateness <= w))  # never added to a closed window
        if final_mode:
            if wm is not None:
                keep &= ends <= wm
            if not (keep & is_new & (ends <= fired_through)).any():  # no late re-fire: only unfired windows
                keep &= ends > fired_through
        else:
            groups = work.column(KEY_GROUP_COL).to_numpy()[which]
            keep &= np.isin(groups, np.fromiter(touched, np.int64, len(touched)))
        at = np.flatnonzero(keep)
        if not len(at):
            return op.output_schema.empty_table()
        by = [*op.key_columns, KEY_GROUP_COL, _END]
        pairs = work.select([*op.key_columns, KEY_GROUP_COL, *self.totals, _NEW, _FIRED_THROUGH]) \
            .take(pa.array(which[at])).append_column(_END, pa.array(ends[at]))
        windows = pairs.group_by(by, use_threads=False).aggregate(
            [*[(n, _COMBINE[n]) for n in self.totals], (_NEW, "any"), (_FIRED_THROUGH, "max")])
        windows = windows.rename_columns({**{f"{n}_{_COMBINE[n]}": n for n in self.totals}, f"{_NEW}_any": _NEW,
                                          f"{_FIRED_THROUGH}_max": _FIRED_THROUGH})
        win_end = windows.column(_END).to_numpy()
        got_new = windows.column(_NEW).to_numpy(zero_copy_only=False)
        if final_mode:
            emit = (win_end > windows.column(_FIRED_THROUGH).to_numpy()) | got_new
        else:
            emit = got_new
        late = got_new & (win_end <= w) if w is not None else np.zeros(len(got_new), dtype=bool)
        return self._rows(windows.filter(pa.array(emit)), late[emit])

    def _rows(self, windows: pa.Table, late: np.ndarray) -> pa.Table:
        op = self.op
        n = windows.num_rows
        ends = windows.column(_END).to_numpy()
        starts = op.window_starts(ends)
        records = {n_: windows.column(n_).to_numpy() for n_ in self.totals}
        records.setdefault(tables.NVALUES, np.zeros(n, np.int64))
        keys = op.keys.cast_keys(windows.select(op.key_columns))
        columns = [*keys.columns, event_time.arrow_from_ms(starts, op.time_kind),
                   event_time.arrow_from_ms(ends, op.time_kind),
                   *op.aggregates.output_columns(records), pa.array(late, pa.bool_())]
        return pa.Table.from_arrays(columns, schema=op.output_schema)

    # -- writing ------------------------------------------------------------------------
    def _write_back(self, store, work: pa.Table, merge: bool, wm: int | None, final: bool, changed: list[int],
                    stored: set[int], fired_through: dict[int, int]) -> None:
        """One entry per changed group: its panes still needed, or none."""
        if final:
            store.delete_many([group_prefix(g, self.ns) for g in changed if g in stored])
            return
        if wm is not None:
            kept = self.op.last_window_end(work.column(tables.PANE_START).to_numpy()) + self.lateness > wm
            work = work.filter(pa.array(kept))
        if merge:
            by = [*self.op.key_columns, KEY_GROUP_COL, tables.PANE_START]
            work = work.group_by(by, use_threads=False).aggregate([(n, _COMBINE[n]) for n in self.totals])
            work = work.rename_columns({f"{n}_{_COMBINE[n]}": n for n in self.totals})
        work = work.sort_by([(KEY_GROUP_COL, "ascending")])
        groups = work.column(KEY_GROUP_COL).to_numpy()
        body = work.select(self.schema.names).cast(self.schema)
        keys, values, gone = [], [], []
        for g in changed:
            lo, hi = np.searchsorted(groups, g, "left"), np.searchsorted(groups, g, "right")
            if hi > lo:
                keys.append(group_prefix(g, self.ns))
                values.append(tables.encode(body.slice(lo, hi - lo), self.shape,
                                            fired_through.get(g, tables.NEVER) if wm is None else wm))
            elif g in stored:
                gone.append(group_prefix(g, self.ns))
        store.put_many(keys, values)
        store.delete_many(gone)

    # -- helpers ------------------------------------------------------------------------
    @staticmethod
    def _with_group(schema: pa.Schema) -> pa.Schema:
        at = next(i for i, n in enumerate(schema.names) if n == tables.PANE_START)
        return schema.insert(at, pa.field(KEY_GROUP_COL, pa.int32()))

    @staticmethod
    def _working(table: pa.Table, new: bool) -> pa.Table:
        return table.append_column(_NEW, pa.array(np.full(table.num_rows, new, dtype=bool)))
