"""What a reader must know to turn one operator's stored bytes back into typed rows:
its key columns and their types, and each state it keeps (built-in aggregate or
window records; a processor's value, list and map states with their declared
schemas). Plain JSON, so it can travel to Spark executors and be recorded next to
a checkpoint's state handles; Arrow schemas are kept as base64 Arrow IPC schema
messages (a flatbuffer, never a pickle).

    {"format": "sparkpoint/state-schema", "version": 1, "operator": "counts",
     "type": "processor", "key_columns": ["key"], "key_schema": "<b64>" | null,
     "time_mode": "eventtime",
     "states": [{"name": "seen", "kind": "list", "schema": "<b64>", "map_key_schema": null}, ...]}
    {..., "type": "aggregate", "aggs": ["count", "sum"], "value_type": "double"}
    {..., "type": "window", "aggs": ["count"], "value_type": "double", "size_ms": 60000,
     "allowed_lateness_ms": 0}                                   (a TumblingWindow)
    {..., "type": "window", "window_kind": "sliding" | "session" | "cumulate", "namespace": "hop",
     "output_mode": "final", "aggs": [...], "value_type": ..., "allowed_lateness_ms": 0}
    {..., "type": "join", "join_kind": "interval" | "window" | "stream", "outer": ["left"],
     "size_ms": 60000 (window joins), "left_schema": "<b64>" | null, "right_schema": "<b64>" | null}
    {..., "type": "dedup"}                                       (a Deduplicate)
    {..., "type": "topn", "rank_column": "rank", "row_schema": "<b64>" | null}

How rows look (`output_schema`): the key columns first, then
  - aggregate: the declared aggs (count BIGINT; sum/min/max in the value type, null
    for a key that saw only null values), i.e. the operator's latest totals;
  - window: window_start, window_end (epoch ms), count [, sum], fired (BOOLEAN): one
    row per key and window still held; a sliding, session or cumulate window: its
    aggs as declared (count, sum, min, max, avg), then fired and late (BOOLEAN);
  - join: side ('left' | 'right'), then for an interval join time_ms (the row's event
    time) and matched (BOOLEAN on an outer side's rows: it met a partner, so it is never
    emitted unmatched; null on the other side's), for a window join window_start and
    window_end (a row waits once in each window it belongs to); then `left` and `right`,
    the row as a struct of its side's columns (null on the other side's rows);
  - dedup: release_ms, when the watermark releases the key: one row per held key;
  - topn: the rank column (1 = first), then the row's other columns: one row per row of
    each key's current top;
  - processor: one column per state, named after it; a schema with one field is read
    as that field's type, with several as a struct: value state -> that type (null
    where the key has none), list state -> array of it, map state -> map from the map
    key's type to the value's type.
Timers (`timer_schema`): the key columns, then for a processor `expiry_ms`; for a
window `window_start`, `timer` ('fire' | 'cleanup') and `expiry_ms`; for a sliding,
session or cumulate window `window_start`, `window_end`, `timer` and `expiry_ms`. Joins
keep no timers: their rows are removed by the watermark (by `time_ms`); nor do a dedup
(the watermark releases a key at its `release_ms`) and a top-n (its rows stay until
better ones push them out).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, replace
from typing import Any, Literal, Mapping

import pyarrow as pa

from sparkpoint.errors import ConfigError, StateSchemaError

SCHEMA_FORMAT = "sparkpoint/state-schema"
SCHEMA_VERSION = 1
OperatorType = Literal["aggregate", "window", "processor", "join", "dedup", "topn"]
WindowKind = Literal["tumbling", "sliding", "session", "cumulate"]
JoinKind = Literal["interval", "window", "stream"]
SIDES = ("left", "right")
StateKind = Literal["value", "list", "map"]
_VALUE_TYPES = {"double": pa.float64(), "bigint": pa.int64()}


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_b64(raw: str, what: str) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw)))
    except (ValueError, TypeError, pa.ArrowInvalid) as e:
        raise StateSchemaError(f"{what} is not a readable Arrow schema ({e})") from None


def column_type(schema: pa.Schema) -> pa.DataType:
    """One field: that field's type; several: a struct of them."""
    return schema.field(0).type if len(schema) == 1 else pa.struct(list(schema))


@dataclass(frozen=True)
class StateVariable:
    name: str
    kind: StateKind
    schema: pa.Schema
    map_key_schema: pa.Schema | None = None

    @property
    def namespace(self) -> str:
        # The namespace StatefulProcessorHandle gives it (sparkpoint.api.processor).
        return f"{self.kind}:{self.name}"

    def column(self) -> pa.Field:
        value = column_type(self.schema)
        if self.kind == "list":
            return pa.field(self.name, pa.list_(value))
        if self.kind == "map":
            return pa.field(self.name, pa.map_(column_type(self.map_key_schema), value))
        return pa.field(self.name, value)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "schema": schema_to_b64(self.schema),
                "map_key_schema": schema_to_b64(self.map_key_schema) if self.map_key_schema else None}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "StateVariable":
        what = f"state {raw.get('name')!r}"
        mk = raw.get("map_key_schema")
        return cls(str(raw["name"]), raw["kind"], schema_from_b64(raw["schema"], what),
                   schema_from_b64(mk, what) if mk else None)


@dataclass(frozen=True)
class OperatorStateSchema:
    operator: str
    type: OperatorType
    key_columns: tuple[str, ...]
    key_schema: pa.Schema | None = None
    states: tuple[StateVariable, ...] = ()
    aggs: tuple[str, ...] = ()
    value_type: str = "double"
    size_ms: int = 0
    allowed_lateness_ms: int = 0
    time_mode: str = "none"
    # sliding, session and cumulate windows (window state in sparkpoint.api.windows.state)
    window_kind: WindowKind = "tumbling"
    namespace: str = ""
    output_mode: str = "final"
    # joins: the row schema of each side, as the state stores its rows
    join_kind: JoinKind = "interval"
    outer: tuple[str, ...] = ()
    left_schema: pa.Schema | None = None
    right_schema: pa.Schema | None = None
    # top-n: the columns of its held rows, as the state stores them, and the rank's name
    row_schema: pa.Schema | None = None
    rank_column: str = "rank"
    # Spark SQL aggregates (a KeyedAggregate's, or a window's, whose first is a hidden
    # count(*)): their texts, the partial columns the store records, and the result columns
    sql_aggs: tuple[str, ...] = ()
    parts_schema: pa.Schema | None = None
    sql_fields: pa.Schema | None = None

    @property
    def is_pane_window(self) -> bool:
        """A sliding, session or cumulate window (one record per window, a due index)."""
        return self.type == "window" and self.window_kind != "tumbling"

    @property
    def needs_store_meta(self) -> bool:
        """What the operator object did not know must come from a store's metadata: the
        key types, a join's or a top-n's row columns."""
        return (self.key_schema is None or (self.type == "join" and self.left_schema is None)
                or (self.type == "topn" and self.row_schema is None) or (bool(self.sql_aggs) and self.sql_fields is None))

    def with_sql_partials(self, parts: pa.Schema, fields: pa.Schema) -> "OperatorStateSchema":
        return replace(self, parts_schema=parts, sql_fields=fields)

    def sql_result_fields(self) -> list[pa.Field]:
        if self.sql_fields is None:
            raise StateSchemaError(f"step {self.operator!r}: the types of its Spark SQL aggregates are not known; its "
                                   "state records them once it has seen rows")
        return list(self.sql_fields)

    def with_side_schemas(self, left: pa.Schema, right: pa.Schema) -> "OperatorStateSchema":
        return replace(self, left_schema=left, right_schema=right)

    def with_row_schema(self, rows: pa.Schema) -> "OperatorStateSchema":
        return replace(self, row_schema=rows)

    def top_row_schema(self) -> pa.Schema:
        if self.row_schema is None:
            raise StateSchemaError(f"TopN {self.operator!r}: the columns of its rows are not known; its state "
                                   "records them once it has seen rows")
        return self.row_schema

    def side_schema(self, side: int) -> pa.Schema:
        found = (self.left_schema, self.right_schema)[side]
        if found is None:
            raise StateSchemaError(f"join {self.operator!r}: the columns of its {SIDES[side]} rows are not known; "
                                   "its state records them once it has seen rows")
        return found

    def with_key_schema(self, schema: pa.Schema) -> "OperatorStateSchema":
        missing = [c for c in self.key_columns if c not in schema.names]
        if missing:
            raise StateSchemaError(f"operator {self.operator!r}: key schema {schema} lacks key column(s) {missing}")
        return replace(self, key_schema=pa.schema([schema.field(c) for c in self.key_columns]))

    def key_fields(self) -> list[pa.Field]:
        if self.key_schema is None:
            raise StateSchemaError(f"operator {self.operator!r}: the types of key columns {list(self.key_columns)} "
                                   "are not known; pass key_schema=... (e.g. 'key BIGINT')")
        return list(self.key_schema)

    @property
    def arrow_value_type(self) -> pa.DataType:
        return _VALUE_TYPES[self.value_type]

    def state(self, namespace: str) -> StateVariable | None:
        return next((s for s in self.states if s.namespace == namespace), None)

    # -- what a read returns -----------------------------------------------------------
    def output_schema(self) -> pa.Schema:
        keys = self.key_fields()
        if self.type == "aggregate" and self.sql_aggs:
            cols = self.sql_result_fields()
        elif self.type == "aggregate":
            types = {"count": pa.int64(), "sum": self.arrow_value_type, "min": self.arrow_value_type,
                     "max": self.arrow_value_type}
            cols = [pa.field(a, types[a]) for a in self.aggs]
        elif self.is_pane_window and self.sql_aggs:
            cols = [pa.field("window_start", pa.int64()), pa.field("window_end", pa.int64()),
                    *self.sql_result_fields(), pa.field("fired", pa.bool_()), pa.field("late", pa.bool_())]
        elif self.is_pane_window:
            types = {"count": pa.int64(), "avg": pa.float64()}
            cols = [pa.field("window_start", pa.int64()), pa.field("window_end", pa.int64()),
                    *[pa.field(a, types.get(a, self.arrow_value_type)) for a in self.aggs],
                    pa.field("fired", pa.bool_()), pa.field("late", pa.bool_())]
        elif self.type == "window":
            cols = [pa.field("window_start", pa.int64()), pa.field("window_end", pa.int64()),
                    pa.field("count", pa.int64())]
            if "sum" in self.aggs:
                cols.append(pa.field("sum", self.arrow_value_type))
            cols.append(pa.field("fired", pa.bool_()))
        elif self.type == "join":
            cols = [pa.field("side", pa.string())]
            if self.join_kind == "interval":
                cols += [pa.field("time_ms", pa.int64()), pa.field("matched", pa.bool_())]
            elif self.join_kind == "window":
                cols += [pa.field("window_start", pa.int64()), pa.field("window_end", pa.int64())]
            cols += [pa.field(SIDES[s], pa.struct(list(self.side_schema(s)))) for s in (0, 1)]
        elif self.type == "dedup":
            cols = [pa.field("release_ms", pa.int64())]
        elif self.type == "topn":
            cols = [pa.field(self.rank_column, pa.int64()),
                    *[f for f in self.top_row_schema() if f.name not in self.key_columns]]
        else:
            cols = [s.column() for s in self.states]
        return self._checked(keys, cols)

    def timer_schema(self) -> pa.Schema:
        keys = self.key_fields()
        if self.type == "aggregate":
            raise ConfigError(f"operator {self.operator!r} is a KeyedAggregate, which keeps no timers; read its state "
                              "with read_state")
        if self.type == "join":
            raise ConfigError(f"join {self.operator!r} keeps no timers: a row leaves its state when the watermark "
                              "passes the end of the time it can still match in; read_state shows each row's time")
        if self.type == "dedup":
            raise ConfigError(f"Deduplicate {self.operator!r} keeps no timers: the watermark releases a held key when "
                              "it reaches the key's release_ms, which read_state shows")
        if self.type == "topn":
            raise ConfigError(f"TopN {self.operator!r} keeps no timers: its rows stay until better ones push them out "
                              "of the top; read them with read_state")
        if self.is_pane_window:
            cols = [pa.field("window_start", pa.int64()), pa.field("window_end", pa.int64()),
                    pa.field("timer", pa.string()), pa.field("expiry_ms", pa.int64())]
        elif self.type == "window":
            cols = [pa.field("window_start", pa.int64()), pa.field("timer", pa.string()),
                    pa.field("expiry_ms", pa.int64())]
        else:
            cols = [pa.field("expiry_ms", pa.int64())]
        return self._checked(keys, cols)

    def _checked(self, keys: list[pa.Field], cols: list[pa.Field]) -> pa.Schema:
        names = [f.name for f in keys] + [f.name for f in cols]
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise StateSchemaError(f"operator {self.operator!r}: column name(s) {clash} are both a key column "
                                   "and a state (or read column); rename the state or the key column")
        return pa.schema(keys + cols)

    # -- JSON ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"format": SCHEMA_FORMAT, "version": SCHEMA_VERSION, "operator": self.operator,
                             "type": self.type, "key_columns": list(self.key_columns),
                             "key_schema": schema_to_b64(self.key_schema) if self.key_schema else None}
        if self.type == "processor":
            d.update(time_mode=self.time_mode, states=[s.to_json() for s in self.states])
        elif self.type == "join":
            d.update(join_kind=self.join_kind, outer=list(self.outer), size_ms=self.size_ms,
                     left_schema=schema_to_b64(self.left_schema) if self.left_schema else None,
                     right_schema=schema_to_b64(self.right_schema) if self.right_schema else None)
        elif self.type == "topn":
            d.update(rank_column=self.rank_column,
                     row_schema=schema_to_b64(self.row_schema) if self.row_schema else None)
        elif self.type != "dedup":
            d.update(aggs=list(self.aggs), value_type=self.value_type)
            if self.sql_aggs:
                d.update(sql_aggs=list(self.sql_aggs),
                         parts_schema=schema_to_b64(self.parts_schema) if self.parts_schema else None,
                         sql_fields=schema_to_b64(self.sql_fields) if self.sql_fields else None)
        if self.type == "window":
            d.update(size_ms=self.size_ms, allowed_lateness_ms=self.allowed_lateness_ms)
            if self.is_pane_window:
                d.update(window_kind=self.window_kind, namespace=self.namespace, output_mode=self.output_mode)
        return d

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "OperatorStateSchema":
        if raw.get("format") != SCHEMA_FORMAT or raw.get("version") != SCHEMA_VERSION:
            raise StateSchemaError(f"state schema has format {raw.get('format')!r} version {raw.get('version')!r}; "
                                   f"this sparkpoint reads {SCHEMA_FORMAT!r} version {SCHEMA_VERSION}")
        try:
            ks = raw.get("key_schema")
            rows = raw.get("row_schema")
            parts, fields = raw.get("parts_schema"), raw.get("sql_fields")
            sides = [schema_from_b64(raw[f"{side}_schema"], f"{side} rows") if raw.get(f"{side}_schema") else None
                     for side in SIDES]
            return cls(operator=str(raw["operator"]), type=raw["type"], key_columns=tuple(raw["key_columns"]),
                       key_schema=schema_from_b64(ks, "key schema") if ks else None,
                       states=tuple(StateVariable.from_json(s) for s in raw.get("states", ())),
                       aggs=tuple(raw.get("aggs", ())), value_type=raw.get("value_type", "double"),
                       size_ms=int(raw.get("size_ms", 0)),
                       allowed_lateness_ms=int(raw.get("allowed_lateness_ms", 0)),
                       time_mode=raw.get("time_mode", "none"),
                       window_kind=raw.get("window_kind", "tumbling"), namespace=raw.get("namespace", ""),
                       output_mode=raw.get("output_mode", "final"), join_kind=raw.get("join_kind", "interval"),
                       outer=tuple(raw.get("outer", ())), left_schema=sides[0], right_schema=sides[1],
                       row_schema=schema_from_b64(rows, "top-n rows") if rows else None,
                       rank_column=str(raw.get("rank_column", "rank")),
                       sql_aggs=tuple(raw.get("sql_aggs", ())),
                       parts_schema=schema_from_b64(parts, "aggregate partials") if parts else None,
                       sql_fields=schema_from_b64(fields, "aggregate results") if fields else None)
        except (KeyError, TypeError, ValueError) as e:
            raise StateSchemaError(f"state schema of {raw.get('operator')!r} is malformed: {e}") from None
