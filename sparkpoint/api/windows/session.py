"""`SessionWindow`: per-key sessions of activity separated by gaps (Spark's
`session_window(ts, "5 minutes")`, Flink's EventTimeSessionWindows).

Each row at t with gap g spans [t, t + g); rows whose spans overlap or touch are one
session [first t, max(t + g)) (Spark's and Flink's rule). The gap is fixed (`gap=`) or
read per row from a column (`gap_column=`, BIGINT ms or a DAY TO SECOND interval), as
Spark's session_window takes a column expression; a row whose gap is null or <= 0
belongs to no session, as in Spark.

Per epoch, Spark pre-aggregates the epoch's own rows into partial sessions (with a
fixed gap and the one-column aggregates: per key and gap-long slice of time, a hash
aggregate; else `session_window` in a batch groupBy), and the worker merges them with
the key's stored sessions: a partial session that overlaps stored sessions merges with all of
them (a late-ish row can bridge two sessions into one). Lateness is judged per merged
session, as Flink judges a merged window: one that joins no stored session and ends
at or before W - allowed lateness is dropped and its rows counted; one that joins a
stored session is kept (that session is still open). A session fires when the
watermark reaches its end (last event + gap).

Final mode and merges: when late rows extend or bridge sessions that already fired,
the merged session fires (late=True) under its own start and end; the sessions it
absorbed are not retracted. A reader that keeps one row per key and session keeps,
for overlapping rows of a key, the one emitted last.

State: with the one-column aggregates (count, sum, min, max, avg) a key group's open
sessions are one Arrow table (session_table_state.py), merged with the epoch's
partial sessions by sorting and reducing, without a loop per key; with Spark SQL
aggregates, and in a store that held per-session state before that layout, each
session is one record with a due entry (state.py), merged key by key (`_merge`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api import event_time
from sparkpoint.api.durations import duration_ms
from sparkpoint.api.windows.base import WindowOperator
from sparkpoint.api.windows.session_table_state import P_SESSION_END, P_SESSION_START, SessionTables
from sparkpoint.api.windows.state import Windows
from sparkpoint.errors import ConfigError
from sparkpoint.state.interfaces import KEY_GROUP_COL, EpochContext
from sparkpoint.state.keys import encode_user_keys, key_group_range, plain_key_tuples

_SESSION = "__session"


class SessionWindow(WindowOperator):
    """Per-key event-time session windows: rows closer than the gap (fixed, or per row
    from `gap_column`) form one session, which fires when the watermark reaches its
    last event + gap.

    Output: key columns, window_start, window_end (the session's bounds), `aggs`
    (Spark SQL aggregates, docs/aggregates.md; or count, sum, min, max, avg of
    `value_column`), late. Output modes and lateness as
    `SlidingWindow`."""

    state_namespace = "session"

    def __init__(self, name: str, key_columns: Sequence[str], time_column: str, gap: int | str | None = None,
                 aggs: Sequence[str] = ("count",), value_column: str | None = None,
                 allowed_lateness: int | str = 0, output_mode: str = "final", *, gap_column: str | None = None,
                 value_type: str | pa.DataType = "double", key_schema: Any = None):
        what = f"SessionWindow {name!r}"
        if (gap is None) == (gap_column is None):
            raise ConfigError(f"{what}: give either gap='5 min' (one gap for all rows) or gap_column='...' "
                              "(each row's gap, in ms), not both or neither")
        self.gap_ms = None if gap is None else duration_ms(gap, f"{what} gap")
        if self.gap_ms is not None and self.gap_ms <= 0:
            raise ConfigError(f"{what}: the gap must be > 0, got {self.gap_ms} ms")
        self.gap_column = gap_column
        super().__init__(name, key_columns, time_column, aggs=aggs, value_column=value_column,
                         value_type=value_type, allowed_lateness=allowed_lateness, output_mode=output_mode,
                         key_schema=key_schema)

    # -- Spark side -------------------------------------------------------------------
    def pre_aggregate(self, df, carry=()):
        from pyspark.sql import functions as F
        from pyspark.sql.types import DayTimeIntervalType

        if self.gap_column is None and self.aggregates.sql is None:
            return self._pre_aggregate_by_gap(df, carry)
        kind = event_time.spark_kind(df.schema, self.time_column, self._used_for)
        ts = F.col(self.time_column)
        if kind == event_time.MS:
            ts = F.timestamp_millis(ts.cast("bigint"))
        if self.gap_column is None:
            gap = f"{self.gap_ms} milliseconds"
        elif isinstance(df.schema[self.gap_column].dataType, DayTimeIntervalType):
            gap = F.col(self.gap_column)
        else:
            gap = F.concat(F.col(self.gap_column).cast("bigint").cast("string"), F.lit(" milliseconds"))
        grouped = df.groupBy(*self.key_columns, F.session_window(ts, gap).alias(_SESSION)) \
            .agg(*self.aggregates.spark_partials(), *carry)
        self.aggregates.resolve_from_spark(grouped.schema)  # SQL aggregates' types, known on the driver
        if kind == event_time.TIMESTAMP_NTZ:
            epoch = F.lit("1970-01-01 00:00:00").cast("timestamp_ntz")
            start = F.timestamp_diff("MILLISECOND", epoch, F.col(f"{_SESSION}.start"))
            end = F.timestamp_diff("MILLISECOND", epoch, F.col(f"{_SESSION}.end"))
        else:
            start, end = F.unix_millis(F.col(f"{_SESSION}.start")), F.unix_millis(F.col(f"{_SESSION}.end"))
        return grouped.select(*[c for c in grouped.columns if c != _SESSION],
                              start.alias(P_SESSION_START), end.alias(P_SESSION_END))

    def _pre_aggregate_by_gap(self, df, carry=()):
        """Partial sessions from a hash aggregate instead of Spark's sort-based
        `session_window`: two rows of a key in one gap-long slice of time
        [k*gap, (k+1)*gap) are less than a gap apart, so they are in one session, and the
        slice's rows span [first t, last t + gap) together. The worker merges the slices
        of a session as it merges any partial sessions (overlapping or touching spans are
        one), so the sessions are the same; the shuffle carries at most one row per key
        and slice. A gap per row (`gap_column`) gives no such slices, and Spark SQL
        aggregates keep `session_window`'s fewer, larger partials for the per-window
        engine they run on."""
        from pyspark.sql import functions as F

        ms = self.event_time_ms(df)
        gap = F.lit(self.gap_ms)
        grouped = df.groupBy(*self.key_columns, (ms - F.pmod(ms, gap)).alias(_SESSION)) \
            .agg(*self.aggregates.spark_partials(), F.min(ms).alias(P_SESSION_START),
                 (F.max(ms) + gap).alias(P_SESSION_END), *carry)
        return grouped.drop(_SESSION)

    # -- worker side ------------------------------------------------------------------
    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        if self.aggregates.sql is None:
            self.keys.ensure(store, rows)
            groups = key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism)
            if SessionTables.uses_tables(self, store, groups):
                return SessionTables(self).apply(store, rows, ctx)
        return super().apply(store, rows, ctx)

    def _gaps(self, rows: pa.Table) -> pa.Array:
        if self.gap_column is None:
            return pa.array(np.full(rows.num_rows, self.gap_ms, dtype=np.int64))
        col = rows.column(self.gap_column)
        if pa.types.is_duration(col.type):
            return col.cast(pa.duration("ms"), safe=False).cast(pa.int64())
        if not pa.types.is_integer(col.type):
            raise ConfigError(f"{self._used_for}: gap column {self.gap_column!r} is {col.type}; it must hold each "
                              "row's gap in milliseconds (BIGINT) or a DAY TO SECOND interval")
        return col.cast(pa.int64())

    def _partial_sessions(self, rows: pa.Table) -> pa.Table:
        if P_SESSION_START in rows.column_names:
            starts = rows.column(P_SESSION_START).cast(pa.int64())
            ends = rows.column(P_SESSION_END).cast(pa.int64())
        else:  # raw rows: each spans [t, t + gap)
            starts = event_time.arrow_ms(rows.column(self.time_column))
            gaps = self._gaps(rows)
            ends = pc.if_else(pc.greater(gaps, 0), pc.add(starts, gaps), pa.scalar(None, pa.int64()))
        table = rows.select([*self.key_columns, KEY_GROUP_COL]).append_column(P_SESSION_START, starts) \
            .append_column(P_SESSION_END, ends)
        for name, col in self.aggregates.partial_columns(rows).items():
            table = table.append_column(name, col)
        return table.filter(pc.and_(pc.is_valid(table.column(P_SESSION_START)),
                                    pc.is_valid(table.column(P_SESSION_END))))

    def _merge(self, store, rows: pa.Table, watermark: int | None) -> pa.Table:
        parts = self._partial_sessions(rows)
        n = parts.num_rows
        records = self.windows.new_records(n)
        records["start"] = parts.column(P_SESSION_START).to_numpy()
        records["end"] = parts.column(P_SESSION_END).to_numpy()
        sql_parts = self.aggregates.fill(records, parts)  # None for the one-column aggregates
        groups = parts.column(KEY_GROUP_COL).to_pylist()
        user_keys = encode_user_keys(parts, self.key_columns)
        key_values = plain_key_tuples(parts, self.key_columns)
        by_key: dict[tuple[int, bytes], list[int]] = {}
        for i, key in enumerate(zip(groups, user_keys)):
            by_key.setdefault(key, []).append(i)
        gone: list[Windows] = []
        made: list[tuple[int, bytes, tuple, np.ndarray, bool]] = []
        sources: list[tuple[pa.Table | None, list[int]]] = []  # per made session: stored and new SQL partials
        dropped = 0
        for (group, user_key), mine in by_key.items():
            stored_starts, stored = self.windows.read_key(store, group, user_key)
            stored_parts = None if sql_parts is None else self.windows.read_key_parts(store, group, user_key)
            for cluster_parts, cluster_stored in _clusters(records[mine], stored):
                if not cluster_parts:
                    continue  # a stored session no row of this epoch touches
                merged = self._fold(records[[mine[i] for i in cluster_parts]])
                olds = stored[cluster_stored]
                end = int(merged["end"][0])
                if not len(olds) and watermark is not None and end + self.allowed_lateness_ms <= watermark:
                    dropped += int(merged["count"][0])
                    continue
                if len(olds):
                    merged = self._fold(np.concatenate([merged, olds]))
                    gone.append(Windows([group] * len(olds), [user_key] * len(olds), stored_starts[cluster_stored],
                                        [key_values[mine[0]]] * len(olds), olds))
                ends = np.concatenate([olds["end"], merged["end"]])
                late = watermark is not None and bool((ends <= watermark).any())
                merged["late"] = int(late or bool(olds["late"].any()))
                merged["fired"] = 0  # fires at its end; at once if the watermark has passed it
                made.append((group, user_key, key_values[mine[0]], merged, late))
                if sql_parts is not None:
                    sources.append((stored_parts.take(pa.array(cluster_stored, pa.int64())) if cluster_stored else None,
                                    sorted(mine[i] for i in cluster_parts)))  # arrival order
        self.windows.count_dropped(store, dropped)
        for w in gone:
            self.windows.remove(store, w)
        if not made:
            return self.output_schema.empty_table()
        w = Windows([m[0] for m in made], [m[1] for m in made],
                    np.array([int(m[3]["start"][0]) for m in made], dtype=np.int64), [m[2] for m in made],
                    np.concatenate([m[3] for m in made]))
        if sql_parts is not None:
            pieces, slots = [], []
            for slot, (olds_parts, new) in enumerate(sources):  # stored first: they arrived first
                for piece in ([olds_parts] if olds_parts is not None else []) + [sql_parts.take(pa.array(new, pa.int64()))]:
                    pieces.append(piece)
                    slots += [slot] * piece.num_rows
            w.parts = self.aggregates.fold_parts(pa.concat_tables(pieces), np.array(slots, dtype=np.int64))
        self.windows.write(store, w)
        return self._updated(w, np.array([m[4] for m in made], dtype=bool))

    def _fold(self, sessions: np.ndarray) -> np.ndarray:
        """One record (an array of one) holding all of `sessions`: bounds and partials."""
        out = sessions[:1].copy()
        for i in range(1, len(sessions)):
            self.aggregates.add(out, sessions[i:i + 1])
        out["start"] = sessions["start"].min()
        out["end"] = sessions["end"].max()
        return out


def _clusters(parts: np.ndarray, stored: np.ndarray) -> list[tuple[list[int], list[int]]]:
    """Group a key's partial sessions and stored sessions into merged sessions: spans
    that overlap or touch (next start <= current end) are one. Returns, per merged
    session, the indexes of its partials and of its stored sessions."""
    spans = sorted([(int(s), int(e), 0, i) for i, (s, e) in enumerate(zip(parts["start"], parts["end"]))]
                   + [(int(s), int(e), 1, i) for i, (s, e) in enumerate(zip(stored["start"], stored["end"]))])
    out: list[tuple[list[int], list[int]]] = []
    end = None
    for start, stop, from_store, i in spans:
        if end is None or start > end:
            out.append(([], []))
            end = stop
        else:
            end = max(end, stop)
        out[-1][from_store].append(i)
    return out
