"""The declared state of a pipeline's stateful operator, as a
`sparkpoint.state.descriptor.OperatorStateSchema`: what the state reader needs to
decode that operator's stored bytes.

A `StatefulProcessor` declares its states in `init(handle)`, so a fresh processor is
initialized against a handle that only records the declarations (the way Flink's
State Processor API reads keyed state through the state descriptors the job used).
"""

from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa

from sparkpoint.api.aggfuncs import AggregateSet
from sparkpoint.api.aggfuncs import rows as stored_rows
from sparkpoint.api.aggfuncs.stored import PARTS_META
from sparkpoint.api.aggregate import _KEY_SCHEMA_META, KeyedAggregate
from sparkpoint.api.dedup import Deduplicate
from sparkpoint.api.join import _INPUT_SCHEMA_META, LEFT_COL, RIGHT_COL, IntervalJoin, StreamJoin, WindowJoin, _Join
from sparkpoint.api.processor import ProcessorOperator, StatefulProcessorHandle
from sparkpoint.api.topn import _ROWS_SCHEMA, TopN
from sparkpoint.api.window import TumblingWindow
from sparkpoint.api.windows import CumulateWindow, SessionWindow, SlidingWindow
from sparkpoint.api.windows.base import WindowOperator
from sparkpoint.api.windows.tumbling import TumblingWindow as EngineTumblingWindow
from sparkpoint.errors import ConfigError
from sparkpoint.state.codec import SchemaLike, parse_schema
from sparkpoint.state.descriptor import OperatorStateSchema, StateVariable
from sparkpoint.state.interfaces import StatefulOperator


class _RecordingHandle(StatefulProcessorHandle):
    """Records each declared state; the state objects it returns are never used."""

    def __init__(self, processor_name: str, time_mode: str):
        super().__init__(None, processor_name, time_mode)  # type: ignore[arg-type]
        self.recorded: list[StateVariable] = []

    def getValueState(self, stateName: str, schema: SchemaLike, ttlDurationMs: int | None = None):
        self._record(stateName, "value", schema)
        return super().getValueState(stateName, schema, ttlDurationMs)

    def getListState(self, stateName: str, schema: SchemaLike, ttlDurationMs: int | None = None):
        self._record(stateName, "list", schema)
        return super().getListState(stateName, schema, ttlDurationMs)

    def getMapState(self, stateName: str, userKeySchema: SchemaLike, valueSchema: SchemaLike,
                    ttlDurationMs: int | None = None):
        self._record(stateName, "map", valueSchema, userKeySchema)
        return super().getMapState(stateName, userKeySchema, valueSchema, ttlDurationMs)

    def _record(self, name: str, kind: str, schema: SchemaLike, map_key: SchemaLike | None = None) -> None:
        if any(s.name == name for s in self.recorded):
            return  # a second declaration of the same state; the handle checks the kind
        self.recorded.append(StateVariable(
            name, kind, parse_schema(schema, f"state {name!r}"),  # type: ignore[arg-type]
            parse_schema(map_key, f"map key of state {name!r}") if map_key is not None else None))


# A tumbling window on the shared engine keeps a sliding window's state (slide = size).
_WINDOW_KINDS = {SlidingWindow: "sliding", EngineTumblingWindow: "sliding", SessionWindow: "session",
                 CumulateWindow: "cumulate"}
_JOIN_KINDS = {IntervalJoin: "interval", WindowJoin: "window", StreamJoin: "stream"}


def describe(operator: Any) -> OperatorStateSchema:
    """The state schema of `operator` (a stateful operator, or a Pipeline holding one)."""
    op = getattr(operator, "stateful_", operator)
    if op is None:
        steps = [n.name for n in operator.steps()] if hasattr(operator, "steps") else []
        if len(steps) > 1:
            raise ConfigError(f"the pipeline has several stateful steps {steps}: pass the one to read, as its "
                              "operator object (operator=...)")
        raise ConfigError("the pipeline has no stateful step, so it keeps no keyed state to read")
    return _with_known_partials(_describe(op), _sql_aggregates(op))


def _describe(op: Any) -> OperatorStateSchema:
    key_schema = _known_key_schema(op)
    sql = _sql_aggregates(op)
    sql_aggs = () if sql is None else tuple(c.text for c in sql.calls)
    if isinstance(op, KeyedAggregate):
        return OperatorStateSchema(op.name, "aggregate", tuple(op.key_columns), key_schema, aggs=tuple(op.aggs),
                                   value_type=_value_type_name(getattr(op, "value_type", pa.float64())),
                                   sql_aggs=sql_aggs)
    if isinstance(op, TumblingWindow):
        return OperatorStateSchema(op.name, "window", tuple(op.key_columns), key_schema, aggs=op.aggs,
                                   value_type=_value_type_name(op.value_type), size_ms=op.size_ms,
                                   allowed_lateness_ms=op.allowed_lateness_ms)
    if isinstance(op, WindowOperator) and type(op) in _WINDOW_KINDS:
        return OperatorStateSchema(op.name, "window", tuple(op.key_columns), key_schema, aggs=tuple(op.aggs),
                                   value_type=_value_type_name(op.value_type),
                                   allowed_lateness_ms=op.allowed_lateness_ms, window_kind=_WINDOW_KINDS[type(op)],
                                   namespace=op.state_namespace, output_mode=op.output_mode, sql_aggs=sql_aggs)
    if isinstance(op, _Join) and type(op) in _JOIN_KINDS:
        desc = OperatorStateSchema(op.name, "join", tuple(op.key_columns), key_schema,
                                   join_kind=_JOIN_KINDS[type(op)],  # type: ignore[arg-type]
                                   outer=tuple(side for side in ("left", "right") if op.how == side),
                                   size_ms=getattr(op, "size_ms", 0))
        rows = getattr(op, "_stored", None) or op._input  # known once it ran in this process
        return desc if rows is None else _with_join_rows(desc, rows)
    if isinstance(op, Deduplicate):
        return OperatorStateSchema(op.name, "dedup", tuple(op.key_columns), key_schema)
    if isinstance(op, TopN):
        # Only the schema the store's rows were written in (known once the step ran in
        # this process), never the input's now: else it comes from the store.
        return OperatorStateSchema(op.name, "topn", tuple(op.key_columns), key_schema,
                                   rank_column=op.rank_column, row_schema=op._stored_schema)
    if isinstance(op, ProcessorOperator):
        handle = _RecordingHandle(op.name, op.time_mode)
        processor = op._new_processor()
        processor.init(handle)
        return OperatorStateSchema(op.name, "processor", tuple(op.key_columns), key_schema,
                                   states=tuple(handle.recorded), time_mode=op.time_mode)
    if isinstance(op, StatefulOperator):
        raise ConfigError(f"operator {getattr(op, 'name', op)!r} is a {type(op).__name__}; the state reader "
                          "knows KeyedAggregate, the windows, the joins, Deduplicate, TopN and ProcessorOperator")
    raise ConfigError(f"expected a stateful operator or a Pipeline, got {type(operator).__name__}")


# Store metadata a state reader needs besides the keys (the stores are self-describing
# there): key types for every keyed step, the row columns for a join and a top-n, the
# partial columns of Spark SQL aggregates.
STORE_META = (_KEY_SCHEMA_META, _INPUT_SCHEMA_META, _ROWS_SCHEMA.meta_name, PARTS_META)


def _sql_aggregates(op: Any) -> AggregateSet | None:
    """A step's Spark SQL aggregates (a KeyedAggregate's, a window's), or None."""
    sql = getattr(op, "sql", None)
    if sql is not None and hasattr(sql, "aggs"):
        return sql.aggs
    return getattr(getattr(op, "aggregates", None), "sql", None)


def _with_known_partials(desc: OperatorStateSchema, sql: AggregateSet | None) -> OperatorStateSchema:
    """The partial and result columns, when the operator object has learnt them (it ran
    here, or its input schema told it); else they come from the store."""
    if sql is None or not sql.resolved:
        return desc
    return desc.with_sql_partials(sql.part_schema(), _result_schema(desc, sql))


def _result_schema(desc: OperatorStateSchema, sql: AggregateSet) -> pa.Schema:
    """A window's first aggregate is its hidden row count, not a column of its own."""
    fields = sql.output_fields()
    return pa.schema(fields[1:] if desc.type == "window" else fields)


def sql_partials(desc: OperatorStateSchema) -> "SqlPartials | None":
    """What the state reader needs to turn a step's stored Spark SQL partials into its
    aggregates' values; None for a step without them."""
    if not desc.sql_aggs:
        return None
    if desc.parts_schema is None:
        desc.sql_result_fields()  # raises: unknown until the state records them
    return SqlPartials(desc)


class SqlPartials:
    def __init__(self, desc: OperatorStateSchema):
        self.what = f"step {desc.operator!r}"
        self.aggs = AggregateSet(self.what, list(desc.sql_aggs))
        self.aggs.resolve_from_partials(desc.parts_schema)
        self.fields = desc.sql_result_fields()
        self.skip = 1 if desc.type == "window" else 0

    def decode(self, raw: list[bytes]) -> pa.Table:
        return stored_rows.decode_many(raw, self.aggs.part_schema(), self.what)

    def results(self, parts: pa.Table) -> list[pa.Array]:
        values = self.aggs.results(parts)[self.skip:]
        return [col.cast(f.type) for f, col in zip(self.fields, values)]


def complete_from_store(desc: OperatorStateSchema, get_meta: Callable[[str], bytes | None]) -> OperatorStateSchema:
    """`desc` with what the operator object did not know (it never ran here) read from a
    store's metadata (`get_meta(name)`: the bytes of one of STORE_META, or None)."""
    if desc.key_schema is None:
        raw = get_meta(_KEY_SCHEMA_META)
        if raw is not None:
            desc = desc.with_key_schema(pa.ipc.read_schema(pa.py_buffer(raw)))
    if desc.type == "join" and desc.left_schema is None:
        raw = get_meta(_INPUT_SCHEMA_META)
        if raw is not None:
            desc = _with_join_rows(desc, pa.ipc.read_schema(pa.py_buffer(raw)))
    if desc.type == "topn" and desc.row_schema is None:
        raw = get_meta(_ROWS_SCHEMA.meta_name)
        if raw is not None:
            desc = desc.with_row_schema(pa.ipc.read_schema(pa.py_buffer(raw)))
    if desc.sql_aggs and desc.sql_fields is None:
        raw = get_meta(PARTS_META)
        if raw is not None:
            sql = AggregateSet(f"step {desc.operator!r}", list(desc.sql_aggs))
            sql.resolve_from_partials(pa.ipc.read_schema(pa.py_buffer(raw)))
            desc = _with_known_partials(desc, sql)
    return desc


def _with_join_rows(desc: OperatorStateSchema, tagged: pa.Schema) -> OperatorStateSchema:
    """The side row schemas from a join's tagged input schema (its stored rows' types)."""
    left, right = (pa.schema(list(tagged.field(c).type)) for c in (LEFT_COL, RIGHT_COL))
    return desc.with_side_schemas(left, right)


def _known_key_schema(op: Any) -> pa.Schema | None:
    keys = getattr(op, "keys", None)
    return getattr(keys, "schema", None)


def _value_type_name(t: pa.DataType) -> str:
    return "double" if pa.types.is_floating(t) else "bigint"
