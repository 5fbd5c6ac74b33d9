"""Arbitrary keyed state, shaped after PySpark's `transformWithStateInPandas`.

A user writes a `StatefulProcessor` exactly as for PySpark (camelCase methods work;
snake_case ones too) and wraps it in `ProcessorOperator`. Per epoch and subtask:

  1. a fresh processor is made and `init(handle)` declares its state variables,
  2. for every key with rows this epoch (in key order), `handle_input_rows(key, rows,
     timer_values)` runs with the key's rows as one pandas DataFrame (PySpark's
     `handleInputRows` gets an iterator holding that one DataFrame),
  3. due timers fire in timestamp order (event time: timestamp <= watermark;
     processing time: timestamp <= processing time; `ctx.final`: all), each through
     `handle_expired_timer(key, timer_values, expired_timer_info)`; a timer is deleted
     before its callback runs, so the callback may register it again,
  4. `close()`; all yielded DataFrames are checked against `output_schema`.

State objects are scoped to the key being processed, like PySpark's. Every write is
part of the epoch's atomic commit; nothing is pickled (values follow declared schemas).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Iterator, Literal

import msgpack
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from sparkpoint.api.aggregate import KeySchema, require_key_groups
from sparkpoint.api.durations import duration_ms
from sparkpoint.api.event_time import timer_ms
from sparkpoint.errors import ConfigError, StateSchemaError
from sparkpoint.state import ttl
from sparkpoint.state.codec import RowCodec, SchemaLike, parse_schema, require_hashable
from sparkpoint.state.interfaces import KEY_GROUP_COL, MARKER_COL, SUBTASK_COL, EpochContext, StatefulOperator
from sparkpoint.state.keys import (decode_timestamp, encode_timestamp, encode_user_keys, group_prefix,
                                   key_columns_from_plain, key_group_range, namespace, plain_key_tuples)

TimeMode = Literal["eventtime", "processingtime", "none"]
_NS_TIMERS = namespace("~timers")             # <group><ns><ts><user key> -> key tuple
_NS_TIMERS_BY_KEY = namespace("~timers-key")  # <group><ns><user key><ts> -> b""
_MAX_FIRING_ROUNDS = 100


class TimerValues:
    """Current processing time and watermark (ms; -1 when not available)."""

    def __init__(self, currentProcessingTimeInMs: int = -1, currentWatermarkInMs: int = -1) -> None:
        self.current_processing_time_ms = currentProcessingTimeInMs
        self.current_watermark_ms = currentWatermarkInMs

    def getCurrentProcessingTimeInMs(self) -> int:
        """The processing time of this epoch (ms since the epoch); the same for every key of the epoch, and replayed as it was when an epoch runs again."""
        return self.current_processing_time_ms

    def getCurrentWatermarkInMs(self) -> int:
        """The watermark this epoch runs under (ms), or -1 before the first event time is seen or without event time."""
        return self.current_watermark_ms


class ExpiredTimerInfo:
    """The timer that fired, handed to `handle_expired_timer`."""

    def __init__(self, expiryTimeInMs: int = -1) -> None:
        self.expiry_time_ms = expiryTimeInMs

    def getExpiryTimeInMs(self) -> int:
        """When the timer was due (ms): the time `registerTimer` was given."""
        return self.expiry_time_ms


class StatefulProcessor:
    """Override `init` and `handle_input_rows` (or PySpark's `handleInputRows`), and
    optionally `handle_expired_timer` / `handleExpiredTimer` and `close`."""

    def init(self, handle: "StatefulProcessorHandle") -> None:
        """Called once per subtask before any key: declare state variables here with `handle.getValueState` / `getListState` / `getMapState` and keep them on `self`. Timers and state values can only be used while a key is processed."""
        pass

    def handle_input_rows(self, key: tuple, rows: pd.DataFrame,
                          timer_values: TimerValues) -> Iterator[pd.DataFrame]:
        """Called once per key with input in the epoch: `key` is the tuple of key column values, `rows` that key's rows of the epoch (one pandas DataFrame). Yield output DataFrames whose columns match the operator's `output_schema`. The default calls PySpark's `handleInputRows`."""
        if type(self).handleInputRows is StatefulProcessor.handleInputRows:
            raise NotImplementedError(f"{type(self).__name__} must define handle_input_rows "
                                      "(or PySpark's handleInputRows)")
        return self.handleInputRows(key, iter([rows]), timer_values)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: TimerValues) -> Iterator[pd.DataFrame]:
        """PySpark's name and signature (`transformWithStateInPandas`): `rows` is an iterator of DataFrames. Define this or `handle_input_rows`."""
        raise NotImplementedError

    def handle_expired_timer(self, key: tuple, timer_values: TimerValues,
                             expired_timer_info: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        """Called once per timer of `key` that is due: an event-time timer when the watermark passes it, a processing-time timer when the epoch's processing time does. Yield output DataFrames; the default calls PySpark's `handleExpiredTimer`, which yields nothing."""
        return self.handleExpiredTimer(key, timer_values, expired_timer_info)

    def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                           expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
        """PySpark's name and signature for `handle_expired_timer`."""
        return iter(())

    def handle_initial_state(self, key: tuple, initial_state: pd.DataFrame,
                             timer_values: TimerValues) -> None:
        """Called once per key of the operator's `initial_state`, in the job's first epoch
        and before that key's rows, never after a restore: `initial_state` holds the key's
        rows of it (one pandas DataFrame). Set the key's state here. The default calls
        PySpark's `handleInitialState`."""
        if type(self).handleInitialState is StatefulProcessor.handleInitialState:
            raise ConfigError(f"{type(self).__name__} is given an initial_state but defines no handle_initial_state "
                              "(or PySpark's handleInitialState) to apply it")
        self.handleInitialState(key, initial_state, timer_values)

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: TimerValues) -> None:
        """PySpark's name and signature for `handle_initial_state`."""
        raise NotImplementedError

    def close(self) -> None:
        """Called when the subtask is done with the processor (end of an epoch's work or of the job)."""


# -- per-key scope ---------------------------------------------------------------------
class _CurrentKey:
    """The key being processed, and the epoch's processing time; state objects read them on every call."""

    def __init__(self, processing_time_ms: int | None = None) -> None:
        self.group: int | None = None
        self.user_key = b""
        self.plain: tuple = ()
        self.processing_time_ms = processing_time_ms

    def prefix(self, ns: bytes) -> bytes:
        if self.group is None:
            raise ConfigError("state and timers can only be used while a key is processed "
                              "(in handle_input_rows / handle_expired_timer), not in init")
        return group_prefix(self.group, ns) + self.user_key

    @property
    def now_ms(self) -> int:
        if self.processing_time_ms is None:
            raise ConfigError("state is read here without a processing time, so its time to live cannot be told")
        return self.processing_time_ms


class _State:
    """What every state kind shares: writing a value with its expiry (sparkpoint.state.ttl)
    and reading only values that have not expired."""

    def __init__(self, store, current: _CurrentKey, ns: bytes, ttl_ms: int | None):
        self._store, self._current, self._ns, self._ttl_ms = store, current, ns, ttl_ms

    def _live(self, raw: bytes | None) -> bytes | None:
        return ttl.live(raw, self._current.now_ms) if raw is not None else None

    def _put(self, keys: list[bytes], encoded: list[bytes]) -> None:
        if self._ttl_ms is None:
            self._store.put_many(keys, encoded)
            return
        expiry = self._current.now_ms + self._ttl_ms  # each write restarts the value's time to live
        self._store.put_many(keys, [ttl.wrap(v, expiry) for v in encoded])
        self._store.put_many([ttl.index_key(k, expiry) for k in keys], [b""] * len(keys))


class ValueState(_State):
    """One value per key (a row of the declared schema), from `handle.getValueState(name, schema)`.
    Every method acts on the key being processed."""

    def __init__(self, store, current: _CurrentKey, ns: bytes, codec: RowCodec, ttl_ms: int | None = None):
        super().__init__(store, current, ns, ttl_ms)
        self._codec = codec

    def exists(self) -> bool:
        """Whether the current key has a value (one past its time to live does not count)."""
        return self._live(self._store.get(self._current.prefix(self._ns))) is not None

    def get(self) -> tuple | None:
        """The current key's value as a tuple of the schema's columns, or None (also once its time to live has passed)."""
        raw = self._live(self._store.get(self._current.prefix(self._ns)))
        return None if raw is None else self._codec.decode(raw)

    def update(self, newValue: Any) -> None:
        """Set the current key's value: a tuple, a dict or a scalar for a one-column schema; values are checked against the schema. With a TTL, the value expires `ttlDurationMs` after this epoch's processing time."""
        self._put([self._current.prefix(self._ns)], [self._codec.encode(newValue)])

    def clear(self) -> None:
        """Remove the current key's value."""
        self._store.delete(self._current.prefix(self._ns))


class ListState(_State):
    """One stored entry per element, so appends cost O(1):
    <group><ns><user key>             -> next sequence number (8 bytes)
    <group><ns><user key><seq: 8 BE>  -> element row
    The exact prefix key sorts before its elements, so one prefix scan reads the list.
    With a TTL each element has its own expiry, set when it is written."""

    def __init__(self, store, current: _CurrentKey, ns: bytes, codec: RowCodec, ttl_ms: int | None = None):
        super().__init__(store, current, ns, ttl_ms)
        self._codec = codec

    def exists(self) -> bool:
        """Whether the current key's list has any element (past their time to live, none count)."""
        return next(self._elements(), None) is not None

    def get(self) -> Iterator[tuple]:
        """The current key's elements in the order they were added, as tuples."""
        return iter([self._codec.decode(v) for v in list(self._elements())])

    def put(self, newState: Iterable[Any]) -> None:
        """Replace the current key's list with `newState` (checked before anything is changed)."""
        rows = [self._codec.encode(v) for v in newState]  # validate before touching state
        self.clear()
        self._append(rows)

    def appendValue(self, newState: Any) -> None:
        """Add one element to the end of the current key's list."""
        self._append([self._codec.encode(newState)])

    def appendList(self, newState: Iterable[Any]) -> None:
        """Add elements to the end of the current key's list."""
        self._append([self._codec.encode(v) for v in newState])

    def clear(self) -> None:
        """Remove the current key's list."""
        head = self._current.prefix(self._ns)
        self._store.delete_many([k for k, _ in list(self._store.scan_prefix(head))])

    def _elements(self) -> Iterator[bytes]:
        head = self._current.prefix(self._ns)
        if self._store.get(head) is None:
            return
        for k, v in self._store.scan_prefix(head):
            if k != head and (value := self._live(v)) is not None:
                yield value

    def _append(self, encoded: list[bytes]) -> None:
        if not encoded:
            return  # PySpark: an empty list state does not exist
        head = self._current.prefix(self._ns)
        raw = self._store.get(head)
        seq = 0 if raw is None else int.from_bytes(raw, "big")
        self._put([head + (seq + i).to_bytes(8, "big") for i in range(len(encoded))], encoded)
        self._store.put(head, (seq + len(encoded)).to_bytes(8, "big"))


class MapState(_State):
    """One stored entry per map key: <group><ns><user key><encoded map key> -> value.
    With a TTL each entry has its own expiry, set when it is written."""

    def __init__(self, store, current: _CurrentKey, ns: bytes, key_codec: RowCodec, value_codec: RowCodec,
                 ttl_ms: int | None = None):
        super().__init__(store, current, ns, ttl_ms)
        self._key_codec, self._value_codec = key_codec, value_codec

    def exists(self) -> bool:
        """Whether the current key's map has any entry (past their time to live, none count)."""
        return next(self._entries(), None) is not None

    def getValue(self, key: Any) -> tuple | None:
        """The value stored under `key` in the current key's map, or None."""
        raw = self._live(self._store.get(self._entry(key)))
        return None if raw is None else self._value_codec.decode(raw)

    def containsKey(self, key: Any) -> bool:
        """Whether the current key's map has `key`."""
        return self._live(self._store.get(self._entry(key))) is not None

    def updateValue(self, key: Any, value: Any) -> None:
        """Store `value` under `key` in the current key's map."""
        self._put([self._entry(key)], [self._value_codec.encode(value)])

    def iterator(self) -> Iterator[tuple[tuple, tuple]]:
        """The current key's entries as (map key, value) tuples, in the order of their encoded keys."""
        return iter([(self._key_codec.decode(k), self._value_codec.decode(v)) for k, v in list(self._entries())])

    def keys(self) -> Iterator[tuple]:
        """The current key's map keys."""
        return (k for k, _ in self.iterator())

    def values(self) -> Iterator[tuple]:
        """The current key's map values."""
        return (v for _, v in self.iterator())

    def removeKey(self, key: Any) -> None:
        """Remove `key` from the current key's map."""
        self._store.delete(self._entry(key))

    def clear(self) -> None:
        """Remove every entry of the current key's map."""
        prefix = self._current.prefix(self._ns)
        self._store.delete_many([k for k, _ in list(self._store.scan_prefix(prefix))])

    def _entries(self) -> Iterator[tuple[bytes, bytes]]:
        """(encoded map key, encoded value) of every live entry."""
        prefix = self._current.prefix(self._ns)
        for k, v in self._store.scan_prefix(prefix):
            if (value := self._live(v)) is not None:
                yield k[len(prefix):], value

    def _entry(self, key: Any) -> bytes:
        # The codec normalizes values to the declared types, so equal keys encode equally.
        return self._current.prefix(self._ns) + self._key_codec.encode(key)


class StatefulProcessorHandle:
    """Declares state variables and manages the current key's timers."""

    def __init__(self, store, processor_name: str, time_mode: TimeMode, processing_time_ms: int | None = None):
        self._store = store
        self._processor = processor_name
        self._time_mode = time_mode
        self._current = _CurrentKey(processing_time_ms)
        self._declared: dict[str, str] = {}
        self.has_ttl = False  # some state was declared with a time to live

    # -- state variables -----------------------------------------------------------------
    def getValueState(self, stateName: str, schema: SchemaLike, ttlDurationMs: int | None = None) -> ValueState:
        """Declare a value state named `stateName` with `schema`: Spark DDL such as "total DECIMAL(12, 2), last TIMESTAMP, tags ARRAY<STRING>", a StructType or a pyarrow.Schema (types and their Python values: docs/processor-state.md). The name is the state's identity in checkpoints. `ttlDurationMs` (ms, or a duration such as "30 min"): the value expires that long after the processing time of the epoch that last wrote it, as with Spark's TTL; None keeps it until cleared."""
        ns, ttl_ms = self._declare(stateName, "value", ttlDurationMs)
        return ValueState(self._store, self._current, ns, RowCodec(stateName, schema), ttl_ms)

    def getListState(self, stateName: str, schema: SchemaLike, ttlDurationMs: int | None = None) -> ListState:
        """Declare a list state named `stateName` whose elements have `schema`; with `ttlDurationMs` each element expires that long after the epoch that wrote it."""
        ns, ttl_ms = self._declare(stateName, "list", ttlDurationMs)
        return ListState(self._store, self._current, ns, RowCodec(stateName, schema), ttl_ms)

    def getMapState(self, stateName: str, userKeySchema: SchemaLike, valueSchema: SchemaLike,
                    ttlDurationMs: int | None = None) -> MapState:
        """Declare a map state named `stateName`: map keys of `userKeySchema`, values of `valueSchema`; with `ttlDurationMs` each entry expires that long after the epoch that last wrote it."""
        ns, ttl_ms = self._declare(stateName, "map", ttlDurationMs)
        key_codec = RowCodec(f"{stateName} (map key)", userKeySchema)
        require_hashable(key_codec.schema, f"map key of state {stateName!r}")
        return MapState(self._store, self._current, ns, key_codec, RowCodec(stateName, valueSchema), ttl_ms)

    def _declare(self, name: str, kind: str, ttl_duration: Any) -> tuple[bytes, int | None]:
        if self._declared.setdefault(name, kind) != kind:
            raise ConfigError(f"processor {self._processor!r}: state {name!r} is declared as both "
                              f"{self._declared[name]} and {kind} state; use distinct names")
        ttl_ms = None
        if ttl_duration is not None:
            what = f"processor {self._processor!r}: ttlDurationMs of state {name!r}"
            ttl_ms = duration_ms(ttl_duration, what)
            if ttl_ms <= 0:
                raise ConfigError(f"{what} is {ttl_duration!r}; a time to live must be positive (or None: no TTL)")
            self.has_ttl = True
        # Each kind has its own namespace: changing a state's kind never misreads old bytes.
        return namespace(f"{kind}:{name}"), ttl_ms

    # -- timers ----------------------------------------------------------------------------
    def registerTimer(self, expiryTimestampMs: Any) -> None:
        """`expiryTimestampMs`: epoch ms (PySpark's unit) or a timestamp such as the
        event-time column's pandas Timestamps (`rows["ts"].max() + pd.Timedelta("30 min")`)."""
        self._require_timers()
        ts = timer_ms(expiryTimestampMs)
        self._store.put(self._current.prefix(_NS_TIMERS_BY_KEY) + encode_timestamp(ts), b"")
        self._store.put(group_prefix(self._current.group, _NS_TIMERS) + encode_timestamp(ts) + self._current.user_key,
                        msgpack.packb(list(self._current.plain), use_bin_type=True))

    def deleteTimer(self, expiryTimestampMs: Any) -> None:
        """Remove the current key's timer due at `expiryTimestampMs` (ms or a timestamp), if there is one."""
        self._require_timers()
        ts = timer_ms(expiryTimestampMs)
        self._store.delete(self._current.prefix(_NS_TIMERS_BY_KEY) + encode_timestamp(ts))
        self._store.delete(group_prefix(self._current.group, _NS_TIMERS) + encode_timestamp(ts)
                           + self._current.user_key)

    def listTimers(self) -> Iterator[int]:
        """The current key's timers, as ms."""
        prefix = self._current.prefix(_NS_TIMERS_BY_KEY)
        return iter([decode_timestamp(k[len(prefix):]) for k, _ in list(self._store.scan_prefix(prefix))])

    def _require_timers(self) -> None:
        if self._time_mode == "none":
            raise ConfigError(f"processor {self._processor!r} uses timers but its time_mode is 'none'; "
                              "use time_mode='eventtime' or 'processingtime'")
        self._current.prefix(b"")  # raises outside a key's scope


def _is_processor(obj: Any) -> bool:
    return not isinstance(obj, type) and (isinstance(obj, StatefulProcessor) or hasattr(obj, "handleInputRows"))


class _ForeignProcessor(StatefulProcessor):
    """Runs a processor written against pyspark's StatefulProcessor class unchanged."""

    def __init__(self, inner: Any):
        self._inner = inner

    def init(self, handle: StatefulProcessorHandle) -> None:
        self._inner.init(handle)

    def handleInputRows(self, key, rows, timerValues):
        return self._inner.handleInputRows(key, rows, timerValues)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        fn = getattr(self._inner, "handleExpiredTimer", None)
        return fn(key, timerValues, expiredTimerInfo) if fn else iter(())

    def handleInitialState(self, key, initialState, timerValues):
        fn = getattr(self._inner, "handleInitialState", None)
        if fn is None:
            raise ConfigError(f"{type(self._inner).__name__} is given an initial_state but defines no "
                              "handleInitialState to apply it")
        fn(key, initialState, timerValues)

    def close(self) -> None:
        self._inner.close()


# -- the operator ----------------------------------------------------------------------
INITIAL_STATE_COL = "__initial_state"  # in the first epoch's rows: a row of the initial state, as a struct


class ProcessorOperator(StatefulOperator):
    """`initial_state`: a DataFrame (Spark, pandas or a pyarrow Table) holding the key
    columns and whatever else the processor's `handle_initial_state` reads; applied
    once, in the job's first epoch, before that epoch's rows (PySpark's
    `transformWithStateInPandas(..., initialState=...)`). A restore never applies it
    again: the state it set is in the checkpoint."""

    def __init__(self, name: str, processor_factory: Callable[[], StatefulProcessor] | StatefulProcessor,
                 key_columns: list[str], output_schema: SchemaLike, time_mode: str = "none", *,
                 key_schema: SchemaLike | None = None, initial_state: Any = None):
        mode = str(time_mode).lower().replace("_", "").replace("-", "")
        if mode not in ("eventtime", "processingtime", "none"):
            raise ConfigError(f"ProcessorOperator {name!r}: time_mode {time_mode!r} must be 'eventtime', "
                              "'processingtime' or 'none'")
        if not key_columns:
            raise ConfigError(f"ProcessorOperator {name!r} needs at least one key column")
        self.name = name
        self.key_columns = list(key_columns)
        self.time_mode: TimeMode = mode  # type: ignore[assignment]
        self._factory = processor_factory
        self._output_schema = parse_schema(output_schema, f"output_schema of processor {name!r}")
        self.keys = KeySchema(name, key_columns, key_schema)
        self.initial_state = initial_state
        if initial_state is not None:
            names = getattr(initial_state, "column_names", None)  # pyarrow
            columns = list(names if names is not None else getattr(initial_state, "columns", ()))
            missing = [c for c in self.key_columns if c not in columns]
            if missing:
                raise ConfigError(f"ProcessorOperator {name!r}: initial_state lacks the key column(s) {missing} "
                                  f"(it has {columns}); name its key columns as the operator's")

    def __getstate__(self) -> dict:
        # The initial state reaches executors as rows of the first epoch, never with the operator.
        return {**self.__dict__, "initial_state": None}

    def resolve_input_schema(self, schema: pa.Schema) -> None:
        self.keys.resolve(schema)

    @property
    def output_schema(self) -> pa.Schema:
        return self._output_schema

    def _new_processor(self) -> StatefulProcessor:
        p = self._factory if _is_processor(self._factory) else self._factory()  # type: ignore[operator]
        if isinstance(p, StatefulProcessor):
            return p
        if _is_processor(p):  # e.g. a subclass of pyspark's own StatefulProcessor
            return _ForeignProcessor(p)
        raise ConfigError(f"processor_factory of {self.name!r} returned {type(p).__name__}, "
                          "not a StatefulProcessor")

    def apply(self, store, rows: pa.Table, ctx: EpochContext) -> pa.Table:
        self.keys.ensure(store, rows)
        processor = self._new_processor()
        handle = StatefulProcessorHandle(store, self.name, self.time_mode, ctx.processing_time_ms)
        timer_values = TimerValues(ctx.processing_time_ms,
                                   ctx.watermark_ms if ctx.watermark_ms is not None else -1)
        outputs: list[pa.Table] = []
        processor.init(handle)
        try:
            if INITIAL_STATE_COL in rows.column_names:
                initial = pc.is_valid(rows.column(INITIAL_STATE_COL))
                self._apply_initial_state(processor, handle, rows.filter(initial), timer_values)
                rows = rows.filter(pc.invert(initial)).drop_columns([INITIAL_STATE_COL])
            if rows.num_rows:
                self._process_rows(processor, handle, rows, timer_values, outputs)
            self._fire_timers(processor, handle, ctx, timer_values, outputs)
        finally:
            processor.close()
        # As Spark does at the end of a batch: what expired by this epoch's processing time leaves the
        # store. Only a processor with a TTL pays for the look (one seek per key group).
        if handle.has_ttl:
            ttl.purge_expired(store, key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism),
                              ctx.processing_time_ms)
        return pa.concat_tables(outputs) if outputs else self._output_schema.empty_table()

    def _apply_initial_state(self, processor: StatefulProcessor, handle: StatefulProcessorHandle, rows: pa.Table,
                             timer_values: TimerValues) -> None:
        """Each key's rows of the initial state through `handle_initial_state`, in key order."""
        if not rows.num_rows:
            return
        struct = rows.column(INITIAL_STATE_COL).combine_chunks()
        initial = pa.Table.from_arrays(struct.flatten(), names=[f.name for f in struct.type]).to_pandas()
        for key, key_rows in self._by_key(handle, rows, initial):
            try:
                processor.handle_initial_state(key, key_rows, timer_values)
            except Exception as e:
                e.add_note(f"in processor {self.name!r}, key {key!r}, applying its initial state")
                raise

    def _by_key(self, handle: StatefulProcessorHandle, rows: pa.Table,
                frame: pd.DataFrame) -> Iterator[tuple[tuple, pd.DataFrame]]:
        """(key, the key's rows of `frame`) for each key of `rows` (row i of `frame` is
        row i of `rows`), in key order, with `handle` in that key's scope."""
        require_key_groups(rows, self.name)
        user_keys = encode_user_keys(rows, self.key_columns)
        codes, uniques = pd.factorize(pd.Series(user_keys, dtype=object), sort=True)
        order = np.argsort(codes, kind="stable")
        bounds = np.flatnonzero(np.diff(codes[order])) + 1
        groups = np.split(order, bounds)
        firsts = pa.array([int(g[0]) for g in groups], type=pa.int64())
        key_values = list(zip(*[rows.column(c).take(firsts).to_pylist() for c in self.key_columns]))
        plain = plain_key_tuples(rows.take(firsts), self.key_columns)
        key_groups = rows.column(KEY_GROUP_COL).take(firsts).to_pylist()
        for idx, key, pk, kg, uk in zip(groups, key_values, plain, key_groups, uniques):
            self._enter(handle, kg, uk, pk)
            yield key, frame.iloc[idx].reset_index(drop=True)

    def _process_rows(self, processor: StatefulProcessor, handle: StatefulProcessorHandle, rows: pa.Table,
                      timer_values: TimerValues, outputs: list[pa.Table]) -> None:
        user_columns = [c for c in rows.column_names if c not in (KEY_GROUP_COL, MARKER_COL, SUBTASK_COL)]
        frame = rows.select(user_columns).to_pandas()
        for key, key_rows in self._by_key(handle, rows, frame):
            try:
                self._collect(processor.handle_input_rows(key, key_rows, timer_values), outputs)
            except Exception as e:  # the one-line failure summary names the key and a record
                record = key_rows.iloc[0].to_dict() if len(key_rows) else {}
                e.add_note(f"in processor {self.name!r}, key {key!r}, first of its {len(key_rows)} row(s) this "
                           f"epoch: {str(record)[:200]}")
                raise

    def _fire_timers(self, processor: StatefulProcessor, handle: StatefulProcessorHandle, ctx: EpochContext,
                     timer_values: TimerValues, outputs: list[pa.Table]) -> None:
        due = self._due_time(ctx)
        if due is None:
            return
        groups = key_group_range(ctx.subtask, ctx.parallelism, ctx.max_parallelism)
        for _ in range(_MAX_FIRING_ROUNDS):
            timers = self._due_timers(handle._store, groups, due)
            if not timers:
                return
            for ts, kg, uk, pk in timers:
                self._enter(handle, kg, uk, tuple(pk))
                handle.deleteTimer(ts)
                key = self._key_from_plain(pk)
                try:
                    self._collect(processor.handle_expired_timer(key, timer_values, ExpiredTimerInfo(ts)), outputs)
                except Exception as e:
                    e.add_note(f"in processor {self.name!r}, key {key!r}, timer at {ts}")
                    raise
        raise ConfigError(f"processor {self.name!r} kept registering due timers for {_MAX_FIRING_ROUNDS} "
                          "rounds in one epoch; register timers in the future of the current time")

    def _due_time(self, ctx: EpochContext) -> float | None:
        if self.time_mode == "none":
            return None
        if ctx.final:
            return math.inf
        if self.time_mode == "eventtime":
            return ctx.watermark_ms
        return ctx.processing_time_ms

    @staticmethod
    def _due_timers(store, groups: range, due: float) -> list[tuple[int, int, bytes, list]]:
        found = []
        for g in groups:
            prefix = group_prefix(g, _NS_TIMERS)
            stop = None if due == math.inf else prefix + encode_timestamp(int(due) + 1)
            entries = store.scan_range(prefix, stop) if stop else store.scan_prefix(prefix)
            for key, value in list(entries):
                ts = decode_timestamp(key[len(prefix):])
                found.append((ts, g, key[len(prefix) + 8:], msgpack.unpackb(value, raw=False)))
        found.sort(key=lambda t: (t[0], t[2]))  # timestamp order; key order within a timestamp
        return found

    def _key_from_plain(self, plain: list) -> tuple:
        arrays = key_columns_from_plain([tuple(plain)], self.keys.fields())
        return tuple(a[0].as_py() for a in arrays)

    @staticmethod
    def _enter(handle: StatefulProcessorHandle, key_group: int, user_key: bytes, plain: tuple) -> None:
        handle._current.group, handle._current.user_key, handle._current.plain = int(key_group), user_key, plain

    def _collect(self, produced: Iterable[Any] | None, outputs: list[pa.Table]) -> None:
        for item in produced or ():
            outputs.append(self._to_arrow(item))

    def _to_arrow(self, item: Any) -> pa.Table:
        schema = self._output_schema
        if isinstance(item, (pa.Table, pa.RecordBatch)):
            item = item.to_pandas()
        if not isinstance(item, pd.DataFrame):
            raise StateSchemaError(f"processor {self.name!r} yielded {type(item).__name__}; yield pandas "
                                   "DataFrames with the columns of output_schema")
        if set(item.columns) != set(schema.names):
            raise StateSchemaError(f"processor {self.name!r} produced columns {list(item.columns)}, but its "
                                   f"output_schema has {schema.names}")
        columns = []
        for f in schema:
            try:
                columns.append(pa.array(item[f.name], type=f.type, from_pandas=True))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
                raise StateSchemaError(f"processor {self.name!r}: output column {f.name!r} does not fit "
                                       f"{f.type}: {e}") from None
            if not f.nullable and columns[-1].null_count:
                raise StateSchemaError(f"processor {self.name!r}: output column {f.name!r} is NOT NULL "
                                       "but has nulls")
        return pa.Table.from_arrays(columns, schema=schema)
