"""Read an operator's keyed state from a checkpoint or savepoint as a Spark DataFrame
(the counterpart of Flink's State Processor API and Spark's `statestore` source).

    df = sparkpoint.read_state(spark, "chk/my-job", operator=my_operator)
    timers = sparkpoint.read_timers(spark, "chk/my-job", operator=my_operator)

The driver reads only `_metadata`: one Spark task per subtask rebuilds that
subtask's store on its executor (snapshot + change logs, every file checked against
the checkpoint's sizes and SHA-256s, exactly as a restore does) in a temporary
directory, decodes every key into rows and deletes the directory. Row shapes:
`sparkpoint.state.descriptor`; the guide: docs/state-reader.md.

Where the schema comes from: a checkpoint records each step's declared state schema
(`runtime/state_schemas.py`, under `state_source.SCHEMA_KEY`), so a step is read by
its name alone (or with no name when the checkpoint holds one stateful step). A
checkpoint taken before schemas were recorded needs the operator object of the
pipeline (or the pipeline), as Flink's reader takes the job's state descriptors; an
operator object given always wins, so state can be read as the pipeline declares it now. Key column types come from the operator when it knows them,
else from `key_schema=`, else from the store itself (each store records them): one
small Spark task rebuilds the cheapest subtask to fetch them (and, for a join or a top-n
whose operator object has not run, the columns of its rows, which their stores record).
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any, Iterator, Mapping

import pyarrow as pa

from sparkpoint.api.state_schema import STORE_META, complete_from_store, describe, sql_partials
from sparkpoint.errors import ConfigError, CorruptSnapshotError, StaleStateError, StateSchemaError
from sparkpoint.runtime.executor.state import SubtaskState
from sparkpoint.runtime.state_source import SCHEMA_KEY, StateSource, open_state_source
from sparkpoint.state import dump
from sparkpoint.state.changelog import Lineage
from sparkpoint.state.codec import SchemaLike, parse_schema
from sparkpoint.state.descriptor import OperatorStateSchema
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout


def read_state(spark, path: str, operator: Any = None, *, storage_options: Mapping[str, Any] | None = None,
               key_schema: SchemaLike | None = None):
    """The keyed state of `operator` in the checkpoint or savepoint at `path`, one row
    per key (per key and window for a window; per held row for a join or a TopN; per
    held key for a Deduplicate).

    `operator`: the step's name, or None when the checkpoint holds one stateful step
    (the schema is the one the checkpoint records); or the stateful operator object of
    the job's pipeline, or the Pipeline (needed for a checkpoint that records no schema). `path`: a job's
    checkpoint directory (latest completed checkpoint), a `chk-N` directory or a
    savepoint; local or any fsspec URL (`storage_options` as for the job)."""
    return _read(spark, path, operator, storage_options, key_schema, "state")


def read_timers(spark, path: str, operator: Any = None, *, storage_options: Mapping[str, Any] | None = None,
                key_schema: SchemaLike | None = None):
    """The registered timers of `operator` (a ProcessorOperator's timers; a
    TumblingWindow's fire and clean-up times), one row per timer."""
    return _read(spark, path, operator, storage_options, key_schema, "timers")


def _read(spark, path: str, operator: Any, storage_options: Mapping[str, Any] | None,
          key_schema: SchemaLike | None, kind: str):
    from pyspark.sql.pandas.types import from_arrow_schema

    from sparkpoint.runtime.arrow_schema import arrow_schema

    source = open_state_source(path, storage_options)
    desc, subtasks = _resolve(source, operator)
    if key_schema is not None:
        desc = desc.with_key_schema(parse_schema(key_schema, "key_schema"))
    options = dict(storage_options or {})
    lineages = [lineage.to_json() for lineage, _ in subtasks]
    if desc.needs_store_meta:
        desc = _probe_store_meta(spark, source, options, subtasks, desc)
    schema = desc.output_schema() if kind == "state" else desc.timer_schema()
    spark_schema = from_arrow_schema(schema)
    # What Spark expects back (e.g. its timestamp unit); executors cast to it.
    target = arrow_schema(spark_schema, "UTC")
    task = _ReadTask(source.files_url, options, lineages, desc.to_json(), kind, source.what, target)
    n = len(lineages)
    return spark.range(0, n, 1, n).mapInArrow(task, spark_schema)


def _resolve(source: StateSource, operator: Any) -> tuple[OperatorStateSchema, list[tuple[Lineage, Mapping]]]:
    found = source.operators()
    if not found:
        raise ConfigError(f"{source.what} holds no keyed state (its job has no stateful operator)")
    if operator is None or isinstance(operator, str):
        if operator is None and len(found) > 1:
            raise ConfigError(f"{source.what} holds the state of operators {sorted(found)}; say which with "
                              "operator=...")
        name = operator if operator is not None else next(iter(found))
        if name not in found:
            raise ConfigError(f"{source.what} holds no state of operator {name!r}; it holds {sorted(found)}")
        recorded = next((h.get(SCHEMA_KEY) for _, h in found[name] if h.get(SCHEMA_KEY)), None)
        if recorded is None:
            raise ConfigError(f"{source.what} does not record the state schema of operator {name!r}; pass the "
                              "operator object of the job's pipeline (or the pipeline) as operator=..., e.g. "
                              f"read_state(spark, path, operator=KeyedAggregate({name!r}, ...))")
        return OperatorStateSchema.from_json(recorded), found[name]
    desc = describe(operator)
    if desc.operator not in found:
        raise ConfigError(f"{source.what} holds no state of operator {desc.operator!r}; it holds {sorted(found)} "
                          "(operators are matched by name)")
    return desc, found[desc.operator]


def _probe_store_meta(spark, source: StateSource, options: dict, subtasks: list[tuple[Lineage, Mapping]],
                      desc: OperatorStateSchema) -> OperatorStateSchema:
    """`desc` completed from what every store records about itself (its key types; a
    join's or a top-n's row columns), read by one small Spark task from the cheapest subtask."""
    started = [lin for lin, _ in subtasks if lin.epoch >= 0 or lin.base is not None]
    if not started:
        raise StateSchemaError(f"operator {desc.operator!r} in {source.what} never ran an epoch, so its key "
                               "types were never recorded; pass key_schema=... (e.g. 'key BIGINT')")
    cheapest = min(started, key=lambda lin: sum(f.size for f in lin.files()))
    task = _ProbeTask(source.files_url, options, cheapest.to_json(), source.what)
    rows = spark.range(0, 1, 1, 1).mapInArrow(task, ", ".join(f"`{m}` binary" for m in STORE_META)).collect()
    found = rows[0].asDict() if rows else {}
    completed = complete_from_store(desc, lambda name: None if found.get(name) is None else bytes(found[name]))
    if completed.key_schema is None:
        raise StateSchemaError(f"subtask {cheapest.subtask} of {desc.operator!r} in {source.what} does not record "
                               "its key types; pass key_schema=... (e.g. 'key BIGINT')")
    return completed


# -- executor side ------------------------------------------------------------------
class _Subtask:
    """One subtask's store, rebuilt from checkpoint storage into a temporary directory."""

    def __init__(self, files_url: str, options: dict, lineage: Mapping[str, Any], where: str):
        self.lineage = Lineage.from_json(lineage)
        self.where = where
        self.fs = StorageFS.from_url(files_url, options)
        self.tmp = tempfile.mkdtemp(prefix="sparkpoint-state-read-")
        self.state = SubtaskState(self.tmp, self.lineage, self.fs, JobLayout(self.fs.root))

    def __enter__(self):
        lin = self.lineage
        try:
            return self.state.open(lin.epoch + 1, trust_local=False)
        except (CorruptSnapshotError, StaleStateError) as e:
            self.__exit__()
            raise CorruptSnapshotError(
                f"cannot read the state of {lin.operator}/{lin.subtask} from the {self.where}. {e}. The state files "
                "of this checkpoint are damaged or missing: read an older checkpoint or another savepoint of the job "
                "instead (`sparkpoint checkpoints verify` shows which ones verify)") from None

    def __exit__(self, *exc: object) -> None:
        self.state.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class _ReadTask:
    """mapInArrow function: the input rows are subtask indexes (one per task)."""

    def __init__(self, files_url: str, options: dict, lineages: list[dict], desc: dict, kind: str, where: str,
                 target: pa.Schema):
        self.files_url, self.options, self.lineages = files_url, options, lineages
        self.desc, self.kind, self.where, self.target = desc, kind, where, target

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        desc = OperatorStateSchema.from_json(self.desc)
        if self.kind == "state":
            partials = sql_partials(desc)

            def decode(entries, desc):
                return dump.read_state(entries, desc, partials=partials)
        else:
            decode = dump.read_timers
        for batch in batches:
            for i in batch.column(0).to_pylist():
                with _Subtask(self.files_url, self.options, self.lineages[i], self.where) as store:
                    try:
                        for table in decode(store.scan_range(b"", None), desc):
                            yield from table.cast(self.target).to_batches()
                    except StateSchemaError as e:
                        raise StateSchemaError(
                            f"the state of {desc.operator}/{i} in the {self.where} does not match the operator "
                            f"given to the reader: {e}; pass the operator as the job that wrote it declared it"
                        ) from None


class _ProbeTask:
    def __init__(self, files_url: str, options: dict, lineage: dict, where: str):
        self.files_url, self.options, self.lineage, self.where = files_url, options, lineage, where

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:
            with _Subtask(self.files_url, self.options, self.lineage, self.where) as store:
                raw = [store.get_meta(name) for name in STORE_META]
            yield pa.record_batch([pa.array([r], pa.binary()) for r in raw], names=list(STORE_META))
