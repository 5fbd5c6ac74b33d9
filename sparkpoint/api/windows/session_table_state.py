"""A `SessionWindow` with one-column aggregates (count, sum, min, max, avg) kept as one
Arrow table of open sessions per key group (sparkpoint/state/session_tables.py), the
way `SlidingWindow` keeps its panes (pane_table_state.py): no per-session records, no
due index, no per-key Python loop.

Per epoch with watermark W (`ctx.watermark_ms`) the outcome is the per-session
engine's (session.py), epoch by epoch:
  1. the stored sessions of the groups that change (rows this epoch, or a session due
     to fire or to be cleaned up) are read, one get per group, and put with the epoch's
     partial sessions; sorted by (key, start), a running maximum of the ends per key
     cuts them into merged sessions (spans that overlap or touch are one);
  2. a merged session holding partials but no stored session whose partials end at or
     before W - allowed lateness is dropped and its rows counted; any other merged
     session holding partials replaces the stored ones it holds, with the partials
     combined (one reduce per merged session), unfired, and late when W has reached
     the end of it or of one of the stored sessions it absorbed (or one of those was
     late); update mode emits it, late as just decided;
  3. final mode emits every unfired session whose end <= W (marked late as stored),
     which is then fired; a session is deleted once end + allowed lateness <= W;
     `ctx.final` emits every unfired session (final mode) and deletes all state;
  4. each changed group's sessions are written back whole, or the entry deleted.
Float sums may differ from the engine's in the last bits: they are added in another
order.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api import event_time
from sparkpoint.api.aggregate import P_COUNT, P_MAX, P_MIN, P_NVALUES, P_SUM
from sparkpoint.api.windows.group_tables import epoch_reads, keeps_tables
from sparkpoint.api.windows.state import FINAL, WINDOW_END, WINDOW_START
from sparkpoint.state import session_tables as tables
from sparkpoint.state.interfaces import KEY_GROUP_COL, EpochContext
from sparkpoint.state.keys import encode_state_key_array, group_prefix, namespace

# The bounds of the partial sessions Spark hands the worker (session.py's pre_aggregate).
P_SESSION_START, P_SESSION_END = "__session_start", "__session_end"

_NS = namespace(tables.SESSION_NS)
_STORED = "__stored"
_PARTIAL_OF = {tables.COUNT: P_COUNT, tables.NVALUES: P_NVALUES, tables.SUM: P_SUM, tables.MIN: P_MIN,
               tables.MAX: P_MAX}
_REDUCE = {tables.COUNT: np.add, tables.NVALUES: np.add, tables.SUM: np.add, tables.MIN: np.minimum,
           tables.MAX: np.maximum}
_BEFORE_ALL, _AFTER_ALL = np.iinfo(np.int64).min, np.iinfo(np.int64).max


class SessionTables:
    def __init__(self, op):
        self.op = op
        self.lateness = op.allowed_lateness_ms
        self.final_mode = op.output_mode == FINAL
        aggregated = op.aggregates.value_column is not None
        kind = pa.float64() if op.aggregates.kind == "f8" else pa.int64()
        self.schema = tables.table_schema(op.keys.fields(), kind if aggregated else None)
        self.totals = [n for n in self.schema.names if n in _REDUCE]
        self.shape = tables.shape_metadata(self.lateness, op.output_mode)
        self.work_schema = pa.schema([*op.keys.fields(), pa.field(KEY_GROUP_COL, pa.int32()),
                                      *[f for f in self.schema if f.name not in op.key_columns]])

    @staticmethod
    def uses_tables(op, store, groups: range) -> bool:
        """True once per store for session tables; a store holding per-session records stays on them."""
        return keeps_tables(store, groups, layout_meta=tables.LAYOUT_META, tables=tables.TABLES,
                            records=tables.SESSIONS, records_namespace=op.state_namespace)

    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        op = self.op
        w = ctx.watermark_ms
        new, touched, wm, wanted = epoch_reads(op, rows, ctx, self._partials)
        held, changing, stored = self._held(store, wanted, touched, wm, ctx.final)
        if new is not None:
            held.append(new)
        if not held:
            return op.output_schema.empty_table()
        sessions, updated = self._merge(store, pa.concat_tables(held), w)
        fired, kept = self._fire(sessions, wm, ctx.final)
        self._write_back(store, kept, sorted(changing | touched), stored)
        out = pa.concat_tables([updated, fired])
        return out.sort_by([(WINDOW_START, "ascending"), (WINDOW_END, "ascending"),
                            *[(k, "ascending") for k in op.key_columns]])

    # -- reading ------------------------------------------------------------------------
    def _partials(self, rows: pa.Table) -> pa.Table | None:
        """The epoch's partial sessions in the working columns."""
        op = self.op
        parts = op._partial_sessions(rows)
        if not parts.num_rows:
            return None
        n = parts.num_rows
        cols = [*op.key_columns, KEY_GROUP_COL, P_SESSION_START, P_SESSION_END, *[_PARTIAL_OF[t] for t in self.totals]]
        table = parts.select(cols).rename_columns([*op.key_columns, KEY_GROUP_COL, tables.START, tables.END,
                                                   *self.totals])
        no = pa.array(np.zeros(n, dtype=bool))
        table = table.append_column(tables.FIRED, no).append_column(tables.LATE, no)
        return table.cast(self.work_schema).append_column(_STORED, no)

    def _held(self, store, wanted: list[int], touched: set[int], wm: int | None,
              final: bool) -> tuple[list[pa.Table], set[int], set[int]]:
        """The stored sessions of the groups that change (with their group), those
        groups, and the wanted groups that have a table."""
        raws = store.get_many([group_prefix(g, _NS) for g in wanted])
        held: list[pa.Table] = []
        changing: set[int] = set()
        stored: set[int] = set()
        for g, raw in zip(wanted, raws):
            if raw is None:
                continue
            stored.add(g)
            table = tables.decode(raw, f"SessionWindow {self.op.name!r}, key group {g}")
            if g not in touched and not final and not self._due(table, wm):
                continue
            changing.add(g)
            n = table.num_rows
            table = table.select(self.schema.names).replace_schema_metadata(None).cast(self.schema)
            table = table.add_column(len(self.op.key_columns), KEY_GROUP_COL, pa.array(np.full(n, g, np.int32)))
            held.append(table.append_column(_STORED, pa.array(np.ones(n, dtype=bool))))
        return held, changing, stored

    def _due(self, table: pa.Table, wm: int | None) -> bool:
        """A session of the table fires or is cleaned up at `wm`."""
        if wm is None:
            return False
        if not table.num_rows:
            return True  # never written so: deleted
        ends = table.column(tables.END).to_numpy()
        if (ends + self.lateness <= wm).any():
            return True
        if not self.final_mode:
            return False
        fired = table.column(tables.FIRED).to_numpy(zero_copy_only=False)
        return bool((~fired & (ends <= wm)).any())

    # -- merging ------------------------------------------------------------------------
    def _merge(self, store, work: pa.Table, w: int | None) -> tuple[pa.Table, pa.Table]:
        """The sessions after the epoch's partials joined them (one row per session),
        and the update-mode rows."""
        op = self.op
        ids = pc.dictionary_encode(encode_state_key_array(work, op.key_columns, KEY_GROUP_COL, b"")).indices
        key = ids.to_numpy()
        start = work.column(tables.START).to_numpy()
        end = work.column(tables.END).to_numpy()
        order = np.lexsort((end, start, key))
        key, start, end = key[order], start[order], end[order]
        is_stored = work.column(_STORED).to_numpy(zero_copy_only=False)[order]
        first_of_key = np.ones(len(key), dtype=bool)
        first_of_key[1:] = key[1:] != key[:-1]
        reach = _running_max(end, first_of_key)  # the furthest end so far within the key
        cut = first_of_key.copy()
        cut[1:] |= start[1:] > reach[:-1]
        at = np.flatnonzero(cut)  # each merged session's first row (sorted order)

        has_stored = np.logical_or.reduceat(is_stored, at)
        has_new = np.logical_or.reduceat(~is_stored, at)
        new_end = np.maximum.reduceat(np.where(is_stored, _BEFORE_ALL, end), at)
        stored_end = np.minimum.reduceat(np.where(is_stored, end, _AFTER_ALL), at)
        s_start, s_end = np.minimum.reduceat(start, at), np.maximum.reduceat(end, at)
        totals = {t: _REDUCE[t].reduceat(work.column(t).to_numpy()[order], at) for t in self.totals}
        fired = work.column(tables.FIRED).to_numpy(zero_copy_only=False)[order]
        late = work.column(tables.LATE).to_numpy(zero_copy_only=False)[order]
        s_fired = np.logical_or.reduceat(fired, at)
        stored_late = np.logical_or.reduceat(late & is_stored, at)

        if w is None:
            drop = np.zeros(len(at), dtype=bool)
            late_now = drop
        else:
            drop = has_new & ~has_stored & (new_end + self.lateness <= w)
            late_now = (stored_end <= w) | (s_end <= w)
        if drop.any():
            op.windows.count_dropped(store, int(totals[tables.COUNT][drop].sum()))
        changed = has_new & ~drop
        s_fired = np.where(changed, False, s_fired)  # a merged session fires at its end
        s_late = np.where(changed, late_now | stored_late, stored_late)

        keep = ~drop
        firsts = order[at[keep]]
        sessions = work.select([*op.key_columns, KEY_GROUP_COL]).take(pa.array(firsts))
        sessions = sessions.append_column(tables.START, pa.array(s_start[keep])) \
            .append_column(tables.END, pa.array(s_end[keep]))
        for t in self.totals:
            sessions = sessions.append_column(t, pa.array(totals[t][keep], self.schema.field(t).type))
        sessions = sessions.append_column(tables.FIRED, pa.array(s_fired[keep])) \
            .append_column(tables.LATE, pa.array(s_late[keep]))
        if self.final_mode:
            return sessions, op.output_schema.empty_table()
        emit = changed[keep]
        return sessions, self._rows(sessions.filter(pa.array(emit)), (late_now & (w is not None))[keep][emit])

    # -- firing and clean-up ------------------------------------------------------------
    def _fire(self, sessions: pa.Table, wm: int | None, final: bool) -> tuple[pa.Table, pa.Table]:
        """The rows fired, and the sessions kept."""
        n = sessions.num_rows
        fired = sessions.column(tables.FIRED).to_numpy(zero_copy_only=False)
        if final:
            emit = ~fired if self.final_mode else np.zeros(n, dtype=bool)
            kept = sessions.slice(0, 0)
        elif wm is None:
            return self.op.output_schema.empty_table(), sessions
        else:
            ends = sessions.column(tables.END).to_numpy()
            emit = ~fired & (ends <= wm) if self.final_mode else np.zeros(n, dtype=bool)
            keep = ends + self.lateness > wm
            kept = sessions.set_column(sessions.schema.get_field_index(tables.FIRED), tables.FIRED,
                                       pa.array(fired | emit)).filter(pa.array(keep))
        out = sessions.filter(pa.array(emit))
        return self._rows(out, out.column(tables.LATE).to_numpy(zero_copy_only=False)), kept

    def _rows(self, sessions: pa.Table, late: np.ndarray) -> pa.Table:
        op = self.op
        n = sessions.num_rows
        if not n:
            return op.output_schema.empty_table()
        records = {t: sessions.column(t).to_numpy() for t in self.totals}
        records.setdefault(tables.NVALUES, np.zeros(n, np.int64))
        keys = op.keys.cast_keys(sessions.select(op.key_columns))
        columns = [*keys.columns, event_time.arrow_from_ms(sessions.column(tables.START).to_numpy(), op.time_kind),
                   event_time.arrow_from_ms(sessions.column(tables.END).to_numpy(), op.time_kind),
                   *op.aggregates.output_columns(records), pa.array(late, pa.bool_())]
        return pa.Table.from_arrays(columns, schema=op.output_schema)

    # -- writing ------------------------------------------------------------------------
    def _write_back(self, store, kept: pa.Table, changed: list[int], stored: set[int]) -> None:
        """One entry per changed group: its open sessions, or none."""
        kept = kept.sort_by([(KEY_GROUP_COL, "ascending")])
        groups = kept.column(KEY_GROUP_COL).to_numpy()
        body = kept.select(self.schema.names).cast(self.schema)
        keys, values, gone = [], [], []
        for g in changed:
            lo, hi = np.searchsorted(groups, g, "left"), np.searchsorted(groups, g, "right")
            if hi > lo:
                keys.append(group_prefix(g, _NS))
                values.append(tables.encode(body.slice(lo, hi - lo), self.shape))
            elif g in stored:
                gone.append(group_prefix(g, _NS))
        store.put_many(keys, values)
        store.delete_many(gone)


def _running_max(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The running maximum of `values` restarted at each `first`: each segment is
    shifted above all earlier ones, so one accumulate serves all (a loop per segment
    where the shifted values would not fit in int64)."""
    if not len(values):
        return values
    at = np.flatnonzero(first)
    lo, hi = np.minimum.reduceat(values, at), np.maximum.reduceat(values, at)
    widths = hi - lo + 1
    if (widths <= 0).any() or float(widths.astype(np.float64).sum()) >= 2.0 ** 62:
        out = np.empty_like(values)
        bounds = [*at.tolist(), len(values)]
        for a, b in zip(bounds[:-1], bounds[1:]):
            out[a:b] = np.maximum.accumulate(values[a:b])
        return out
    base = np.cumsum(widths) - widths
    segment = np.cumsum(first) - 1
    shift = base[segment] - lo[segment]
    return np.maximum.accumulate(values + shift) - shift
