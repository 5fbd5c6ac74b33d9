"""`ProcessorTester`: run a keyed stateful step without Spark, epoch by epoch.

    tester = ProcessorTester(ProcessorOperator("sessionize", Sessionize, ["key"], schema,
                                               time_mode="eventtime"), watermark=("ts", "5 s"))
    tester.process(pd.DataFrame({"key": [1, 1], "ts": [0, 10_000]}))   # one epoch; its output
    tester.advance_watermark(60_000)                                   # fires due timers
    tester.peek_value_state("session", 1)                              # the key's state
    snap = tester.snapshot()                                           # a checkpoint, in files
    restored = ProcessorTester.from_snapshot(step, snap)               # a restore, from those files
    restored.finish()                                                  # end of input: every timer fires

Shaped after Spark's `TwsTester` (per-key input, peek at state, manual watermark and
processing time) and Flink's `KeyedOneInputStreamOperatorTestHarness` (watermarks
fire timers, snapshot, restore into a fresh harness). What runs is not a model of the
runtime but the runtime's own code, as in a Spark Python worker: each call is one
epoch of `EpochTask.run` on a RocksDB store in a temporary directory (the epoch's
change log written to checkpoint storage, then committed locally), a snapshot is the
subtask's lineage with an uploaded RocksDB snapshot, exactly what a checkpoint holds,
and a restore rebuilds the store from those files, each checked by size and SHA-256.
Nothing is pickled. Key groups are Spark's (harness_keys.py), one subtask owns them all.

What a job does that the tester does too, per epoch:
  - the step's rows are the epoch's rows (a `KeyedAggregate` or `TumblingWindow` gets
    them raw: Spark's pre-aggregation only sums what `apply` sums itself);
  - the watermark in effect is the one before the epoch: with `watermark=(column,
    delay)`, the largest event time of earlier epochs minus the delay, as
    `.watermark(column, delay)` sets it; `advance_watermark(ms)` moves it by hand;
  - rows are applied first, then the timers the watermark (or processing time) makes
    due fire in timestamp order; late rows are the step's business (a window drops
    rows past its allowed lateness and counts them: `late_rows_dropped`);
  - `finish()` is the end of a bounded input: every timer and window fires.
The tester does not run the pipeline's PySpark transforms: feed the rows the stateful
step would get.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api import event_time
from sparkpoint.api.processor import INITIAL_STATE_COL, ProcessorOperator, StatefulProcessorHandle
from sparkpoint.api.state_schema import complete_from_store, describe, sql_partials
from sparkpoint.config import parse_duration_ms
from sparkpoint.errors import ConfigError
from sparkpoint.runtime.executor.state import SubtaskState
from sparkpoint.runtime.executor.storage import StorageRef
from sparkpoint.runtime.executor.subtask import META_INFO, EpochTask, RestoreTask, raise_restore_failure
from sparkpoint.runtime.executor.store_opening import EpochInput
from sparkpoint.runtime.lineages import Lineages
from sparkpoint.runtime.stage import split_meta
from sparkpoint.runtime.state_schemas import StateSchemas
from sparkpoint.state import dump
from sparkpoint.state.changelog import Lineage
from sparkpoint.state.interfaces import KEY_GROUP_COL, SUBTASK_COL, StatefulOperator
from sparkpoint.state.keys import encode_user_keys, plain_key_tuples
from sparkpoint.testing.harness_keys import key_groups

_JOB = "tester"
_SUBTASK = 0
SNAPSHOT_FORMAT = "sparkpoint/tester-snapshot"


class _Workspace:
    """A temporary directory that lives as long as a tester or a snapshot uses it."""

    def __init__(self, root: str | None = None):
        self.path = root or tempfile.mkdtemp(prefix="sparkpoint-tester-")
        os.makedirs(self.path, exist_ok=True)
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.path, True) if root is None else None
        _LIVE[self.path] = self

    @classmethod
    def at(cls, path: str) -> "_Workspace":
        """The workspace at `path`: the live one (a snapshot read back from its JSON
        keeps the temporary storage of the tester that took it), else that directory."""
        return _LIVE.get(path) or cls(path)


_LIVE: "weakref.WeakValueDictionary[str, _Workspace]" = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class TesterSnapshot:
    """A tester's state as a checkpoint holds it: the subtask's lineage handle (the JSON
    that goes into `_metadata`) over files in checkpoint storage, plus the job's
    progress (epoch, event time, processing time). `to_json` / `from_json` carry it
    as text; the files stay where `storage` says."""

    __test__ = False  # not a pytest test class, despite its name

    operator: str
    lineage: Mapping[str, Any]
    storage: str
    epoch: int
    max_event_time_ms: int | None
    watermark_ms: int | None
    processing_time_ms: int
    late_rows_dropped: int
    _keeps: Any = field(default=None, compare=False, repr=False)  # the storage directory's owner

    def to_json(self) -> str:
        return json.dumps({"format": SNAPSHOT_FORMAT, "version": 1, "operator": self.operator,
                           "lineage": dict(self.lineage), "storage": self.storage, "epoch": self.epoch,
                           "max_event_time_ms": self.max_event_time_ms, "watermark_ms": self.watermark_ms,
                           "processing_time_ms": self.processing_time_ms,
                           "late_rows_dropped": self.late_rows_dropped}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TesterSnapshot":
        raw = json.loads(text)
        if raw.get("format") != SNAPSHOT_FORMAT or raw.get("version") != 1:
            raise ConfigError(f"not a tester snapshot (format {raw.get('format')!r}, version {raw.get('version')!r})")
        Lineage.from_json(raw["lineage"])  # validated now, not at the first epoch
        return cls(raw["operator"], raw["lineage"], raw["storage"], int(raw["epoch"]), raw["max_event_time_ms"],
                   raw["watermark_ms"], int(raw["processing_time_ms"]), int(raw["late_rows_dropped"]))


class _PeekingHandle(StatefulProcessorHandle):
    """The processor's own handle, keeping the state objects its `init` declares by name."""

    def __init__(self, store, name: str, time_mode: str, processing_time_ms: int):
        super().__init__(store, name, time_mode, processing_time_ms)  # type: ignore[arg-type]
        self.states: dict[str, tuple[str, Any]] = {}

    def getValueState(self, stateName, schema, ttlDurationMs=None):
        state = super().getValueState(stateName, schema, ttlDurationMs)
        self.states[stateName] = ("value", state)
        return state

    def getListState(self, stateName, schema, ttlDurationMs=None):
        state = super().getListState(stateName, schema, ttlDurationMs)
        self.states[stateName] = ("list", state)
        return state

    def getMapState(self, stateName, userKeySchema, valueSchema, ttlDurationMs=None):
        state = super().getMapState(stateName, userKeySchema, valueSchema, ttlDurationMs)
        self.states[stateName] = ("map", state)
        return state


def _step_and_watermark(step: Any, watermark: Any) -> tuple[StatefulOperator, tuple[str, int] | None]:
    op = getattr(step, "stateful_", step)  # a Pipeline: its stateful step and its watermark
    if not isinstance(op, StatefulOperator):
        raise ConfigError(f"ProcessorTester runs a keyed stateful step (ProcessorOperator, KeyedAggregate, "
                          f"TumblingWindow) or a Pipeline with one, not {type(step).__name__}")
    if watermark is None and getattr(step, "watermark_", None) is not None:
        watermark = (step.watermark_.column, step.watermark_.delay_ms)
    if watermark is None:
        return op, None
    column, delay = watermark
    return op, (str(column), parse_duration_ms(delay))


class ProcessorTester:
    """Runs `step` (a `ProcessorOperator`, `KeyedAggregate`, `TumblingWindow`, or a
    `Pipeline`'s stateful step) one epoch per call. `watermark=(column, delay)` derives
    the watermark from the rows as `.watermark(column, delay)` does in a job (a
    Pipeline brings its own); `processing_time_ms` starts the manual clock;
    `directory` keeps the store and checkpoint files there instead of a temporary
    directory (to look at them)."""

    def __init__(self, step: Any, *, watermark: tuple[str, str | int] | None = None, processing_time_ms: int = 0,
                 max_parallelism: int = 128, directory: str | None = None):
        self.step, self._watermark_rule = _step_and_watermark(step, watermark)
        self._max_parallelism = max_parallelism
        self._local = _Workspace(os.path.join(directory, "local") if directory else None)
        self._storage_owner = _Workspace(os.path.join(directory, "checkpoints") if directory else None)
        self._storage = StorageRef(self._storage_owner.path, _JOB)
        self._lineages = Lineages(self.step.name, 1, max_parallelism, materialize_interval_ms=2**62,
                                  max_changelogs=2**62)
        self._epoch = -1
        self._max_event_time: int | None = None
        self._manual_watermark: int | None = None
        self._processing_time = int(processing_time_ms)
        self._late_dropped = 0
        self._outputs: list[pa.Table] = []
        self._input_schema: pa.Schema | None = None
        self._finished = False
        # A fresh tester's first epoch applies a processor's initial_state (from_snapshot: never).
        self._initial_due = getattr(self.step, "initial_state", None) is not None
        self.last_epoch_report: dict[str, Any] = {}

    # -- restore -------------------------------------------------------------------------
    @classmethod
    def from_snapshot(cls, step: Any, snapshot: TesterSnapshot | str, **kwargs: Any) -> "ProcessorTester":
        """A fresh tester (new local store) restored from `snapshot` the way a job
        restores a checkpoint: the store is rebuilt from the snapshot's files, each
        verified, and the epoch, event time and processing time carry on."""
        snap = TesterSnapshot.from_json(snapshot) if isinstance(snapshot, str) else snapshot
        kwargs.setdefault("processing_time_ms", snap.processing_time_ms)
        tester = cls(step, **kwargs)
        if tester.step.name != snap.operator:
            raise ConfigError(f"the snapshot holds the state of step {snap.operator!r}, not of {tester.step.name!r}: "
                              "a step's name is its state identity")
        # The job's check at restore: the state schema the snapshot records against the step's now.
        StateSchemas({tester.step.name: tester.step}).check_restore(tester.step.name, {_SUBTASK: snap.lineage},
                                                                   "the snapshot")
        tester._initial_due = False  # the snapshot's state holds what it set
        tester._storage_owner = snap._keeps or _Workspace.at(snap.storage)
        tester._storage = StorageRef(snap.storage, _JOB)
        tester._lineages.restore({_SUBTASK: snap.lineage})
        tester._epoch = snap.epoch
        tester._max_event_time = snap.max_event_time_ms
        tester._manual_watermark = snap.watermark_ms
        tester._late_dropped = snap.late_rows_dropped
        # The runtime's restore step; it begins a new generation, so no local file of the
        # old tester is trusted.
        lineages = tester._lineages.for_tasks()
        done = RestoreTask(tester._local.path, tester._storage, lineages, generation=tester._lineages.generation)(
            pa.table({SUBTASK_COL: pa.array([0], pa.int32())}))
        _, meta = split_meta(done, pa.schema([]))
        raise_restore_failure({0: json.loads(meta[0][META_INFO])})  # a damaged file: CorruptSnapshotError
        return tester

    def snapshot(self) -> TesterSnapshot:
        """Take a checkpoint of the state as of the last epoch: upload a RocksDB snapshot
        of the store (incremental, like the job's periodic snapshots) and return the
        lineage handle over it."""
        lineage = self._lineage()
        if lineage.epoch < 0:
            handle = lineage.to_json()
        else:
            fs, layout = self._storage.open()
            state = SubtaskState(self._local.path, lineage, fs, layout)
            try:
                state.open(lineage.epoch + 1, given=self._reading())
                snap = state.materialize(lineage.epoch)
            finally:
                state.close(keep=True)
            handle = lineage.rebased(snap, int(snap["epoch"])).to_json()
            # Rebased on the snapshot, the lineage is still this tester's: its store stays
            # valid, so the generation (which a restore would renew) carries on.
            generation = self._lineages.generation
            self._lineages.restore({_SUBTASK: handle})
            self._lineages.generation = generation
        handle = StateSchemas({self.step.name: self.step}).with_schema(self.step.name, handle)  # as a checkpoint does
        return TesterSnapshot(self.step.name, handle, self._storage.url, self._epoch, self._max_event_time,
                              self._manual_watermark, self._processing_time, self._late_dropped,
                              self._storage_owner)

    # -- time -----------------------------------------------------------------------------
    @property
    def watermark_ms(self) -> int | None:
        """The watermark the next epoch runs with (None: no event time yet)."""
        derived = None
        if self._watermark_rule is not None and self._max_event_time is not None:
            derived = self._max_event_time - self._watermark_rule[1]
        known = [w for w in (derived, self._manual_watermark) if w is not None]
        return max(known) if known else None

    @property
    def processing_time_ms(self) -> int:
        return self._processing_time

    def advance_watermark(self, to_ms: int) -> pd.DataFrame:
        """Move the watermark to `to_ms` and run an epoch without rows: event-time
        timers and windows that are now due fire. Returns that epoch's output."""
        current = self.watermark_ms
        if current is not None and int(to_ms) < current:
            raise ValueError(f"the watermark only moves forward: it is {current}, asked for {to_ms}")
        self._manual_watermark = int(to_ms)
        return self._run(None)

    def set_processing_time(self, ms: int) -> pd.DataFrame:
        """Set the manual processing-time clock and run an epoch without rows:
        processing-time timers now due fire. Returns that epoch's output."""
        if int(ms) < self._processing_time:
            raise ValueError(f"processing time only moves forward: it is {self._processing_time}, asked for {ms}")
        self._processing_time = int(ms)
        return self._run(None)

    def advance_processing_time(self, by_ms: int) -> pd.DataFrame:
        return self.set_processing_time(self._processing_time + int(by_ms))

    # -- input --------------------------------------------------------------------------
    def process(self, rows: pd.DataFrame | pa.Table | Iterable[Mapping[str, Any]], key: Any = None) -> pd.DataFrame:
        """Run one epoch over `rows` (any keys; with `key=`, rows of that one key whose
        key columns are left out, as PySpark's `TwsTester.test(key, rows)` takes them).
        Returns the epoch's output: what the rows produced, then the timers that fired."""
        table = _to_arrow(rows)
        if key is not None:
            table = self._with_key(table, key)
        return self._run(table)

    def finish(self) -> pd.DataFrame:
        """The end of a bounded input: one last epoch fires every timer and window."""
        out = self._run(None, final=True)
        self._finished = True
        return out

    # -- what there is to look at --------------------------------------------------------
    @property
    def output(self) -> pd.DataFrame:
        """Every epoch's output so far, in order (Flink's `extractOutputValues`)."""
        tables = [t for t in self._outputs if t.num_rows] or [self.step.output_schema.empty_table()]
        return pa.concat_tables(tables).to_pandas()

    @property
    def late_rows_dropped(self) -> int:
        """Rows a window dropped as later than its allowed lateness (the job's count)."""
        return self._late_dropped

    @property
    def epoch(self) -> int:
        """The last epoch run (-1: none yet)."""
        return self._epoch

    def state(self) -> pd.DataFrame:
        """All keyed state, one row per key, as `sparkpoint.read_state` reads it from a checkpoint."""
        return self._dump(dump.read_state, "output_schema")

    def timers(self) -> pd.DataFrame:
        """All pending timers (and window firings), as `sparkpoint.read_timers` reads them."""
        return self._dump(dump.read_timers, "timer_schema")

    def peek_value_state(self, name: str, key: Any) -> tuple | None:
        return self._peek(name, key, "value", lambda s: s.get())

    def peek_list_state(self, name: str, key: Any) -> list[tuple]:
        return self._peek(name, key, "list", lambda s: list(s.get()))

    def peek_map_state(self, name: str, key: Any) -> dict[tuple, tuple]:
        return self._peek(name, key, "map", lambda s: dict(s.iterator()))

    def list_timers(self, key: Any) -> list[int]:
        """The key's registered timers (epoch ms), as `handle.listTimers()` lists them."""
        return self._peek(None, key, None, lambda handle: list(handle.listTimers()))

    # -- inside ---------------------------------------------------------------------------
    def _lineage(self) -> Lineage:
        return self._lineages.for_tasks()[_SUBTASK]

    def _run(self, rows: pa.Table | None, final: bool = False) -> pd.DataFrame:
        if self._finished:
            raise ConfigError("the tester's input has ended (finish() ran); make a new tester, or restore a "
                              "snapshot taken before finish()")
        op = self.step
        if rows is not None and rows.num_rows:
            if all(c in rows.column_names for c in op.key_columns):
                op.resolve_input_schema(rows.schema)  # the driver's step each epoch (stage.run_epoch)
            rows = self._keyed(rows)
            self._input_schema = rows.schema
        else:  # an epoch without input still runs every subtask
            rows = (self._input_schema or pa.schema([pa.field(KEY_GROUP_COL, pa.int32())])).empty_table()
        if self._initial_due:
            rows = pa.concat_tables([rows, self._initial_state_rows()], promote_options="default")
        epoch = self._epoch + 1
        task = EpochTask(op, self._local.path, epoch, 1, self._max_parallelism,
                         None if final else self.watermark_ms, self._processing_time, final, None, self._storage,
                         self._lineages.for_tasks(),
                         epoch_input=EpochInput(self._lineages.generation, f"tester-epoch-{epoch}"))
        data, meta = split_meta(task.run(_SUBTASK, rows), op.output_schema)
        info = json.loads(meta[0][META_INFO])
        self._lineages.on_epoch(epoch, {_SUBTASK: info})
        self._epoch = epoch
        self._late_dropped += int(info.get("late_dropped") or 0)
        self.last_epoch_report = info.get("state") or {}
        max_ts = self._max_event_time_of(rows)
        if max_ts is not None:
            self._max_event_time = max_ts if self._max_event_time is None else max(self._max_event_time, max_ts)
        self._outputs.append(data)
        self._initial_due = False
        return data.to_pandas()

    def _initial_state_rows(self) -> pa.Table:
        """The step's initial state as its first epoch's extra rows, as the job's first
        epoch carries them (stage.run_epoch): key columns, the row as one struct column."""
        initial = self.step.initial_state
        table = _to_arrow(initial.toPandas() if hasattr(initial, "sparkSession") else initial)
        keys = self._keyed(table.select(self.step.key_columns))
        struct = pa.StructArray.from_arrays([c.combine_chunks() for c in table.columns], names=table.column_names)
        return keys.append_column(INITIAL_STATE_COL, struct)

    def _max_event_time_of(self, rows: pa.Table) -> int | None:
        if self._watermark_rule is None or not rows.num_rows:
            return None
        column = self._watermark_rule[0]
        event_time.arrow_kind(rows.schema, column, f"watermark({column!r}, ...)")  # the job's one-line refusal
        ms = event_time.arrow_ms(rows.column(column))
        top = pc.max(ms).as_py()
        return None if top is None else int(top)

    def _keyed(self, rows: pa.Table) -> pa.Table:
        op = self.step
        missing = [c for c in op.key_columns if c not in rows.column_names]
        if missing:
            raise ConfigError(f"step {op.name!r}: the rows lack key column(s) {missing}; pass them, or key=...")
        known = getattr(getattr(op, "keys", None), "schema", None)
        keys = rows.select(op.key_columns)
        if known is not None:
            keys = keys.cast(known)
        groups = key_groups(keys, op.key_columns, self._max_parallelism)
        if KEY_GROUP_COL in rows.column_names:
            rows = rows.drop_columns([KEY_GROUP_COL])
        return rows.append_column(KEY_GROUP_COL, groups)

    def _with_key(self, table: pa.Table, key: Any) -> pa.Table:
        op = self.step
        values = key if isinstance(key, tuple) else (key,)
        if len(values) != len(op.key_columns):
            raise ConfigError(f"step {op.name!r} is keyed by {op.key_columns}; key={key!r} has {len(values)} value(s)")
        given = [c for c in op.key_columns if c in table.column_names]
        if given:
            raise ConfigError(f"the rows already hold key column(s) {given}; pass either key= or the key columns")
        known = getattr(getattr(op, "keys", None), "schema", None)
        for c, v in zip(op.key_columns, values):
            t = known.field(c).type if known is not None else None
            table = table.append_column(c, pa.array([v] * table.num_rows, type=t))
        return table

    def _reading(self) -> EpochInput:
        # No slice: a read is never taken for a retry of an epoch.
        return EpochInput(self._lineages.generation, "")

    def _open_state(self) -> SubtaskState:
        lineage = self._lineage()
        fs, layout = self._storage.open()
        state = SubtaskState(self._local.path, lineage, fs, layout)
        state.open(lineage.epoch + 1, given=self._reading())
        return state

    def _dump(self, read: Any, schema_of: str) -> pd.DataFrame:
        state = self._open_state()
        try:
            keys = getattr(self.step, "keys", None)
            if keys is not None:
                keys.ensure(state.store, pa.table({}))  # a fresh step learns its key types from the store
            desc = complete_from_store(describe(self.step), state.store.get_meta)
            if desc.key_schema is None:
                raise ConfigError(f"step {self.step.name!r} has seen no rows yet, so its key types are unknown")
            extra = {"partials": sql_partials(desc)} if read is dump.read_state else {}
            tables = list(read(state.store.scan_range(b"", None), desc, **extra))
        finally:
            state.store.discard_pending()  # reading never writes
            state.close(keep=True)
        schema = getattr(desc, schema_of)()
        return (pa.concat_tables([t.cast(schema) for t in tables]) if tables else schema.empty_table()).to_pandas()

    def _peek(self, name: str | None, key: Any, kind: str | None, read: Any) -> Any:
        op = self.step
        if not isinstance(op, ProcessorOperator):
            raise ConfigError(f"step {op.name!r} is a {type(op).__name__}; peek at its state with state()")
        state = self._open_state()
        try:
            op.keys.ensure(state.store, pa.table({}))  # a fresh step learns its key types from the store
            fields = op.keys.fields()  # raises while they are unknown (no rows yet)
            values = key if isinstance(key, tuple) else (key,)
            one = pa.table({f.name: pa.array([v], type=f.type) for f, v in zip(fields, values)})
            group = key_groups(one, op.key_columns, self._max_parallelism)[0].as_py()
            # A peek sees what the processor would see now: nothing past its time to live.
            handle = _PeekingHandle(state.store, op.name, op.time_mode, self._processing_time)
            op._new_processor().init(handle)
            ProcessorOperator._enter(handle, group, encode_user_keys(one, op.key_columns)[0],
                                     plain_key_tuples(one, op.key_columns)[0])
            if name is None:
                return read(handle)
            declared = handle.states.get(name)
            if declared is None or declared[0] != kind:
                have = {n: k for n, (k, _) in handle.states.items()}
                raise ConfigError(f"processor {op.name!r} declares no {kind} state {name!r} (it declares {have})")
            return read(declared[1])
        finally:
            state.store.discard_pending()  # a peek never writes
            state.close(keep=True)


def _to_arrow(rows: Any) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows
    if isinstance(rows, pd.DataFrame):
        return pa.Table.from_pandas(rows, preserve_index=False)
    return pa.Table.from_pylist(list(rows))
