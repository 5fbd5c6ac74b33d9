"""Brute-force references for the window kinds and a driver that runs a window step
epoch by epoch in the user test harness (no Spark).

The references know nothing of the operators' state layout: a row's windows are found
by trying every candidate window, a key's sessions are rebuilt from the rows each epoch,
and the watermark of an epoch is the largest event time of the epochs before it minus
the delay (what `ProcessorTester(watermark=("ts", delay))` applies)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Iterator

import pandas as pd
import pytest

from sparkpoint.testing import ProcessorTester

COLUMNS = ["k", "window_start", "window_end", "count", "sum", "min", "max", "avg", "late"]
AGGS = ("count", "sum", "min", "max", "avg")


def random_epochs(seed: int, *, epochs: int = 8, keys: str = "abc", rows: int = 25, span: int = 4_000,
                  jitter: int = 16_000, gaps: list | None = None, grain: int = 250) -> list[pd.DataFrame]:
    """Epochs of rows whose event times move forward by `span` per epoch but arrive up
    to `jitter` ms out of order; integer-valued doubles (exact sums) and some nulls.
    Event times are multiples of `grain`, so rows fall on window bounds and watermarks
    (the edges where < and <= differ) often."""
    rnd = random.Random(seed)
    out = []
    for e in range(epochs):
        ts = [max(0, e * span + rnd.randrange(-jitter, span)) // grain * grain for _ in range(rows)]
        data = {"k": [rnd.choice(keys) for _ in ts], "ts": ts,
                "v": [None if rnd.random() < 0.1 else float(rnd.randrange(-50, 100)) for _ in ts]}
        if gaps is not None:
            data["gap"] = [rnd.choice(gaps) for _ in ts]
        out.append(pd.DataFrame(data).astype({"ts": "int64", **({"gap": "Int64"} if gaps is not None else {})}))
    return out


def watermarks(epochs: list[pd.DataFrame], delay: int) -> list[int | None]:
    out, top = [], None
    for rows in epochs:
        out.append(None if top is None else top - delay)
        m = int(rows["ts"].max())
        top = m if top is None else max(top, m)
    return out


def aggregate(values: list) -> dict:
    vs = [v for v in values if v is not None and v == v]
    return {"count": len(values), "sum": sum(vs) if vs else None, "min": min(vs) if vs else None,
            "max": max(vs) if vs else None, "avg": sum(vs) / len(vs) if vs else None}


def row(key, start: int, end: int, values: list, late: bool, summarize: Callable | None = None) -> tuple:
    if summarize is not None:
        return (key, start, end, *summarize(values), bool(late))
    a = aggregate(values)
    return (key, start, end, a["count"], a["sum"], a["min"], a["max"], a["avg"], bool(late))


def as_rows(df: pd.DataFrame, columns: list[str] = COLUMNS) -> list[tuple]:
    def plain(v):
        if hasattr(v, "tolist"):  # a list column: as a sorted tuple (sets have no order)
            return tuple(sorted(v.tolist()))
        return None if v is None or (isinstance(v, float) and v != v) else v
    return sorted(tuple(plain(v) for v in r) for r in df[columns].itertuples(index=False, name=None))


def _values(rows: pd.DataFrame, columns: tuple[str, ...]) -> list:
    """Per row: its value (one column), or the tuple of its values (several)."""
    cols = [[None if v is None or v != v else v for v in rows[c]] for c in columns]
    return cols[0] if len(cols) == 1 else list(zip(*cols))


# -- fixed windows (sliding, cumulate) ----------------------------------------------------
def fixed_reference(epochs: list[pd.DataFrame], windows_of: Callable[[int], list[tuple[int, int]]], delay: int,
                    lateness: int, mode: str, columns: tuple[str, ...] = ("v",),
                    summarize: Callable | None = None) -> tuple[list[list[tuple]], int]:
    """Per epoch (then one more: the end of input) the rows a window step must emit,
    and the number of rows dropped as too late. `summarize(values)` gives the
    aggregates of a window's values of `columns` (default: count, sum, min, max, avg
    of v)."""
    marks = watermarks(epochs, delay)
    accepted: dict[tuple, list[tuple[int, float | None]]] = {}  # window -> [(epoch, value)]
    dropped = 0
    for e, (rows, w) in enumerate(zip(epochs, marks)):
        for k, ts, v in zip(rows["k"], rows["ts"], _values(rows, columns)):
            mine = [(s, end) for s, end in windows_of(int(ts)) if w is None or end + lateness > w]
            dropped += not mine
            for s, end in mine:
                accepted.setdefault((k, s, end), []).append((e, v))
    out: list[list[tuple]] = [[] for _ in range(len(epochs) + 1)]
    final = len(epochs)
    for (k, s, end), got in accepted.items():
        def upto(e: int) -> list:
            return [v for ep, v in got if ep <= e]

        def late_upto(e: int) -> bool:
            return any(marks[ep] is not None and marks[ep] >= end for ep, _ in got if ep <= e)
        epochs_with_rows = sorted({ep for ep, _ in got})
        if mode == "update":
            for e in epochs_with_rows:
                out[e].append(row(k, s, end, upto(e), marks[e] is not None and marks[e] >= end, summarize))
            continue
        first = epochs_with_rows[0]
        fire = next((e for e in range(first, len(epochs)) if marks[e] is not None and marks[e] >= end), final)
        out[fire].append(row(k, s, end, upto(fire), late_upto(fire), summarize))
        for e in epochs_with_rows:
            if e > fire:
                out[e].append(row(k, s, end, upto(e), True, summarize))
    return [sorted(o) for o in out], dropped


def sliding_windows_of(size: int, slide: int) -> Callable[[int], list[tuple[int, int]]]:
    def of(t: int) -> list[tuple[int, int]]:
        first = (t - size) // slide - 1
        return [(k * slide, k * slide + size) for k in range(first, t // slide + 2)
                if k * slide <= t < k * slide + size]
    return of


def cumulate_windows_of(step: int, size: int) -> Callable[[int], list[tuple[int, int]]]:
    def of(t: int) -> list[tuple[int, int]]:
        period = t // size * size
        return [(period, period + j * step) for j in range(1, size // step + 1) if t < period + j * step]
    return of


# -- sessions -----------------------------------------------------------------------------
@dataclass
class _Session:
    rows: list  # (t, gap, v)
    fired: bool = False
    late: bool = False

    @property
    def start(self) -> int:
        return min(t for t, _, _ in self.rows)

    @property
    def end(self) -> int:
        return max(t + g for t, g, _ in self.rows)


@dataclass
class _Book:
    open: dict = field(default_factory=dict)  # key -> [_Session]


def session_reference(epochs: list[pd.DataFrame], gap_of: Callable[[pd.Series], int | None], delay: int,
                      lateness: int, mode: str, columns: tuple[str, ...] = ("v",),
                      summarize: Callable | None = None) -> tuple[list[list[tuple]], int]:
    marks = watermarks(epochs, delay)
    book = _Book()
    out: list[list[tuple]] = [[] for _ in range(len(epochs) + 1)]
    dropped = 0
    for e, (rows, w) in enumerate(zip(epochs, marks)):
        new: dict = {}
        for r, v in zip(rows.itertuples(index=False), _values(rows, columns)):
            g = gap_of(r)
            if g is not None and g > 0:
                new.setdefault(r.k, []).append((int(r.ts), int(g), v))
        for k, fresh in new.items():
            sessions = book.open.get(k, [])
            spans = sorted([(t, t + g, ("old", i), (t, g, v)) for i, s in enumerate(sessions) for t, g, v in s.rows]
                           + [(t, t + g, ("new", 0), (t, g, v)) for t, g, v in fresh], key=lambda span: span[:3])
            clusters, end = [], None
            for start, stop, origin, item in spans:  # rebuilt from the rows: overlapping or touching spans join
                if end is None or start > end:
                    clusters.append([])
                    end = stop
                end = max(end, stop)
                clusters[-1].append((origin, item))
            kept = []
            for cluster in clusters:
                olds = sorted({o[1] for o, _ in cluster if o[0] == "old"})
                if not any(o[0] == "new" for o, _ in cluster):
                    kept.append(sessions[olds[0]])
                    continue
                merged = _Session([item for _, item in cluster])
                if not olds and w is not None and merged.end + lateness <= w:
                    dropped += len(cluster)
                    continue
                late = w is not None and (merged.end <= w or any(sessions[i].end <= w for i in olds))
                merged.late = late or any(sessions[i].late for i in olds)
                kept.append(merged)
                if mode == "update":
                    out[e].append(row(k, merged.start, merged.end, [v for _, _, v in merged.rows], late, summarize))
            book.open[k] = kept
        if w is not None:
            _fire_and_clean(book, out[e], w, lateness, mode, summarize)
    _fire_and_clean(book, out[len(epochs)], None, lateness, mode, summarize)
    return [sorted(o) for o in out], dropped


def _fire_and_clean(book: _Book, out: list, w: int | None, lateness: int, mode: str,
                    summarize: Callable | None = None) -> None:
    for k, sessions in book.open.items():
        kept = []
        for s in sessions:
            if mode == "final" and not s.fired and (w is None or s.end <= w):
                out.append(row(k, s.start, s.end, [v for _, _, v in s.rows], s.late, summarize))
                s.fired = True
            if w is None or s.end + lateness > w:
                kept.append(s)
        book.open[k] = kept


# -- the harness ----------------------------------------------------------------------------
def run_in_tester(make_step: Callable[[], object], epochs: list[pd.DataFrame], delay: int,
                  snapshot_after: int | None = None,
                  columns: list[str] = COLUMNS) -> tuple[list[list[tuple]], int, ProcessorTester]:
    """Each epoch's output (then finish()'s), the rows dropped, and the tester; with
    `snapshot_after=n`, a snapshot after epoch n is restored into a fresh tester (and a
    fresh step object) that runs the rest."""
    tester = ProcessorTester(make_step(), watermark=("ts", delay))
    outputs = []
    for e, rows in enumerate(epochs):
        outputs.append(as_rows(tester.process(rows), columns))
        if snapshot_after == e:
            snap = tester.snapshot().to_json()  # as text, the way a checkpoint carries it
            dropped_before = tester.late_rows_dropped
            tester = ProcessorTester.from_snapshot(make_step(), snap, watermark=("ts", delay))
            assert tester.late_rows_dropped == dropped_before
    outputs.append(as_rows(tester.finish(), columns))
    return outputs, tester.late_rows_dropped, tester


def stored_entries(tester: ProcessorTester) -> list[bytes]:
    """Every keyed entry (window records and due-index entries) in the tester's store
    as of its last epoch (store metadata aside)."""
    from sparkpoint.state.keys import META_PREFIX

    state = tester._open_state()
    try:
        return [k for k, _ in state.store.scan_range(b"", META_PREFIX)]
    finally:
        state.store.discard_pending()
        state.close(keep=True)


def run_in_subtasks(state_dir, step, epochs: list[pd.DataFrame], delay: int, parallelism: int) -> list[list[tuple]]:
    """Each epoch's output over `parallelism` subtasks, each with its own store and key
    groups (the runtime's worker step per subtask), then the end of input's."""
    import pyarrow as pa
    from operator_support import ctx, run_partitioned, with_key_groups

    marks = watermarks(epochs, delay)
    outputs = []
    for e, rows in enumerate([*epochs, None]):
        table = with_key_groups(pa.Table.from_pandas(rows if rows is not None else epochs[0].iloc[:0],
                                                     preserve_index=False), ["k"])
        context = ctx(e, None, final=True) if rows is None else ctx(e, marks[e])
        outputs.append(as_rows(run_partitioned(state_dir, step, table, context, parallelism).to_pandas()))
    return outputs


# -- group tables beside the per-window engine ---------------------------------------------
# Sliding, cumulate and session windows with one-column aggregates keep one Arrow table
# per key group; each is checked against the per-window engine it replaced.
AGGREGATE_SETS = pytest.mark.parametrize("aggs,value_type,columns", [
    (("count",), "double", ["k", "window_start", "window_end", "count", "late"]),
    (AGGS, "bigint", COLUMNS),
    (("max", "count"), "double", ["k", "window_start", "window_end", "max", "count", "late"])],
    ids=["count-only", "bigint-values", "two-aggregates"])


def run_beside_the_engine(make_tables: Callable[[], object], make_engine: Callable[[], object],
                          epochs: list[pd.DataFrame], delay: int) -> tuple[list[list[tuple]], int]:
    """Each epoch's output (then finish()'s) and the rows dropped of a step on group
    tables, once checked to equal the per-window engine's epoch by epoch and a run
    restored from a snapshot after epoch 4."""
    engine, engine_dropped, _ = run_in_tester(make_engine, epochs, delay)
    out, dropped, _ = run_in_tester(make_tables, epochs, delay)
    assert out == engine
    assert dropped == engine_dropped
    restored = run_in_tester(make_tables, epochs, delay, snapshot_after=4)
    assert restored[:2] == (out, dropped)
    return out, dropped


def engine_then_tables(make_engine: Callable[[], object], make_tables: Callable[[], object],
                       epochs: list[pd.DataFrame], delay: int) -> tuple[list[list[tuple]], ProcessorTester]:
    """The outputs of the first 4 epochs on the per-window engine, then of the rest on a
    group-table step restored from the engine's snapshot; and that tester, before the
    end of input."""
    tester = ProcessorTester(make_engine(), watermark=("ts", delay))
    out = [as_rows(tester.process(rows)) for rows in epochs[:4]]
    tester = ProcessorTester.from_snapshot(make_tables(), tester.snapshot().to_json(), watermark=("ts", delay))
    out += [as_rows(tester.process(rows)) for rows in epochs[4:]]
    return out, tester


def states_beside_the_engine(make_step: Callable[[], object], layout: type, epochs: list[pd.DataFrame], delay: int,
                             columns: list[str]) -> Iterator[tuple[list[list[tuple]], list[list[tuple]]]]:
    """Per epoch, the state rows (`columns`) and the timers the state reader reads from
    two testers of the step: [0] on group tables, [1] kept on the per-window layout
    (`layout.uses_tables` answering no)."""
    testers = [ProcessorTester(make_step(), watermark=("ts", delay)) for _ in range(2)]
    for rows in epochs:
        states, timers = [], []
        for tester, engine in zip(testers, (False, True)):
            with pytest.MonkeyPatch.context() as patch:
                if engine:
                    patch.setattr(layout, "uses_tables", staticmethod(lambda op, store, groups: False))
                tester.process(rows)
            state = tester.state()
            states.append(sorted(tuple(None if v != v else v for v in r)
                                 for r in state[columns].itertuples(index=False, name=None)))
            timers.append(sorted(tester.timers().itertuples(index=False, name=None)))
        yield states, timers


def stored_namespaces(tester: ProcessorTester) -> set[bytes]:
    """The namespaces of the keyed entries in the tester's store (stored_entries)."""
    return {k[2:3 + k[2]] for k in stored_entries(tester)}
