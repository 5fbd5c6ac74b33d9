"""A directory-of-files source: JSON lines or Parquet, new files picked up as
they arrive. Files are taken in name order; the position is the list of files
already read, so a restore never re-reads or skips one. Files must be complete
when they appear (write elsewhere, then rename into the directory).

The one split is "dir". Runs before this name used "files", which is also the key
under which checkpoint handles list state files (storage/handles.py); positions
of such older checkpoints are still read.

Bad records (JSON lines). A line is bad when it is not JSON, when a value does not
fit its declared type, or when a field declared NOT NULL in `schema` is missing or
null. Spark's `mode` decides what the stream sees: PERMISSIVE keeps the row (nulls
where values did not fit; `columnNameOfCorruptRecord` holds the raw line), DROPMALFORMED
drops it, FAILFAST stops the job with one line naming the file, the reason and the line.
Bad records are counted once per input file per run (`malformed_records`, progress,
`sparkpoint_source_malformed_records_total`). Passed on as rows of nulls without the
user having chosen so (no `mode`, corrupt-record column or `dead_letter`), they are also
warned about once per epoch, with the count and the options to set. With
`dead_letter=DIR` they are not passed on but land in DIR as Parquet (source, file,
line, reason), exactly once: each epoch stages its files' bad records under
DIR/_staging (one file per input file, same content on a replay), and they are
published when a checkpoint covering that input file completes
(`notify_checkpoint_complete`; on restore, staged files the restored positions cover are
published first). A dead-letter file is named `<input file name>.<id>.parquet`, the id
a hash of the source's name and the input file's full path: input files of the same
name in other directories (other sources or jobs sharing DIR) never collide. Files
named `_*`/`.*` are ignored by readers, so DIR reads as a dataset.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import threading
import uuid
import weakref
from collections import Counter, defaultdict
from typing import Any, Mapping
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from sparkpoint.connectors.base import Positions, SlicePlan, Source, SourceContext, empty_frame
from sparkpoint.errors import ConfigError

log = logging.getLogger(__name__)

_SPLIT = "dir"
_LEGACY_SPLIT = "files"  # the split of checkpoints written by older versions
MODES = ("PERMISSIVE", "DROPMALFORMED", "FAILFAST")
_CORRUPT = "__sp_corrupt"
_FILE = "__sp_file"
_RAW = "__sp_raw"
_BAD = "__sp_bad"
DEAD_LETTER_SCHEMA = pa.schema([("source", pa.string()), ("file", pa.string()), ("line", pa.string()),
                                ("reason", pa.string())])


class MalformedRecordError(ConfigError):
    """A bad record under mode=FAILFAST. Restarting would read the same file again, so
    the job stops (a ConfigError is never restarted)."""


class FileSource(Source):
    def __init__(self, path: str, *, format: str = "json", schema: str, name: str = "files",
                 max_files_per_epoch: int = 10, pattern: str | None = None, bounded: bool = False,
                 mode: str | None = None, column_name_of_corrupt_record: str | None = None,
                 options: Mapping[str, Any] | None = None, dead_letter: str | None = None):
        if format not in ("json", "parquet"):
            raise ConfigError(f"FileSource format {format!r}: use 'json' (JSON lines) or 'parquet'")
        self.path = path
        self.format = format
        self._schema = schema
        self.name = name
        self.max_files = max_files_per_epoch
        self.pattern = pattern or ("*.json*" if format == "json" else "*.parquet")
        # Flink's FileSource without monitorContinuously(): read what is there, then finish.
        self.bounded = bounded
        # Spark's reader options; `mode` and `columnNameOfCorruptRecord` may come either way.
        opts = {str(k): v for k, v in (options or {}).items()}
        lowered = {k.lower(): k for k in opts}
        mode = mode or opts.pop(lowered.get("mode", ""), None)
        corrupt = column_name_of_corrupt_record or opts.pop(lowered.get("columnnameofcorruptrecord", ""), None)
        # Spark's default turns a bad record into a row of nulls; unless the user chose
        # how bad records are handled, each epoch that has some says so.
        self._warn_null_rows = mode is None and corrupt is None and dead_letter is None
        mode = mode or "PERMISSIVE"
        if str(mode).upper() not in MODES:
            raise ConfigError(f"FileSource {name!r}: mode {mode!r} must be one of {', '.join(MODES)} (Spark's)")
        if "multiline" in lowered and str(opts[lowered["multiline"]]).lower() == "true":
            raise ConfigError(f"FileSource {name!r}: multiLine JSON is not supported; use JSON lines")
        self.mode = str(mode).upper()
        self.corrupt_column = corrupt
        self.options = opts
        self.dead_letter = dead_letter
        if dead_letter is not None and format != "json":
            raise ConfigError(f"FileSource {name!r}: dead_letter is for JSON lines (Parquet has no bad lines)")
        self.malformed_records = 0
        self._counted: set[str] = set()  # input files whose bad records this run counted
        self._published_on_restore = False
        self._metric = None
        self._cached = None
        self._spark = None

    @property
    def schema(self) -> str:
        return self._schema

    def bind_metrics(self, registry: Any) -> None:
        self._metric = malformed_counter(registry)

    def open(self, ctx: SourceContext) -> None:
        self._spark = ctx.spark

    def initial_positions(self) -> Positions:
        return {_SPLIT: []}

    def _available(self) -> list[str]:
        if not os.path.isdir(self.path):
            return []
        return sorted(n for n in os.listdir(self.path)
                      if fnmatch.fnmatch(n, self.pattern) and not n.startswith((".", "_")))

    def discover(self, positions: Positions) -> Positions:
        if not self._published_on_restore:
            # A crash may have hit between a checkpoint's _metadata and its publish.
            self._published_on_restore = True
            self._publish(positions)
        return positions

    def plan(self, positions: Positions) -> SlicePlan:
        done = _done(positions)
        new = [n for n in self._available() if n not in done][: self.max_files]
        return SlicePlan({_SPLIT: sorted(done)}, {_SPLIT: sorted(done | set(new))})

    def plan_size(self, plan: SlicePlan) -> int | None:
        return len(_done(plan.end) - _done(plan.start))

    def shrink(self, plan: SlicePlan, units: int) -> SlicePlan:
        """The first `units` new files in name order (the order files are taken in)."""
        done = _done(plan.start)
        new = sorted(_done(plan.end) - done)[: max(1, units)]
        return SlicePlan({_SPLIT: sorted(done)}, {_SPLIT: sorted(done | set(new))})

    def is_exhausted(self, positions: Positions) -> bool:
        return self.bounded and not self.lag(positions)[_SPLIT]

    def lag(self, positions: Positions) -> dict[str, int]:
        done = _done(positions)
        return {_SPLIT: sum(1 for n in self._available() if n not in done)}

    def read(self, plan: SlicePlan):
        new = sorted(_done(plan.end) - _done(plan.start))
        if self._cached is not None:
            self._cached.unpersist()
            self._cached = None
        if not new:
            return empty_frame(self._spark, self._output_struct())
        paths = [os.path.join(self.path, n) for n in new]
        if self.format == "parquet":
            return self._spark.read.schema(self._schema).options(**self.options).parquet(*paths)
        return self._read_json(paths)

    # -- JSON lines and their bad records ---------------------------------------------
    def _declared(self):
        from pyspark.sql.types import StructType, _parse_datatype_string

        declared = _parse_datatype_string(self._schema)
        # Spark wants the corrupt-record column in the schema too; it is added here instead.
        return StructType([f for f in declared.fields if f.name != self.corrupt_column])

    def _output_struct(self):
        from pyspark.sql.types import StringType, StructField, StructType

        fields = [StructField(f.name, f.dataType, True) for f in self._declared().fields]
        if self.corrupt_column and self.format == "json":
            fields.append(StructField(self.corrupt_column, StringType(), True))
        return StructType(fields)

    def _read_json(self, paths: list[str]):
        from pyspark.sql import functions as F
        from pyspark.sql.types import StringType, StructField, StructType

        declared = self._declared()
        names = [f.name for f in declared.fields]
        required = [f.name for f in declared.fields if not f.nullable]
        parse = StructType([StructField(f.name, f.dataType, True) for f in declared.fields]
                           + [StructField(_CORRUPT, StringType(), True)])
        opts = {**{k: str(v) for k, v in self.options.items()}, "mode": "PERMISSIVE",
                "columnNameOfCorruptRecord": _CORRUPT}
        # Text first, then from_json: every record keeps its raw line, also a record whose
        # only fault is a missing field (Spark's JSON reader has no raw line for that).
        text = (self._spark.read.text(paths)
                .select(F.input_file_name().alias(_FILE), F.col("value").alias(_RAW))
                .where(F.trim(F.col(_RAW)) != ""))
        parsed = text.select(_FILE, _RAW, F.from_json(F.col(_RAW), parse, opts).alias("p")) \
            .select(_FILE, _RAW, *[F.col(f"p.{n}").alias(n) for n in names], F.col(f"p.{_CORRUPT}").alias(_CORRUPT))
        bad = F.col(_CORRUPT).isNotNull()
        for n in required:
            bad = bad | F.col(n).isNull()
        flat = parsed.withColumn(_BAD, bad).cache()
        self._cached = flat
        self._on_bad_records(flat.where(F.col(_BAD)).select(_FILE, _RAW, *names).collect(), paths, declared)
        if self.mode == "DROPMALFORMED" or self.dead_letter is not None:
            flat = flat.where(~F.col(_BAD))
        out = [F.col(n) for n in names]
        if self.corrupt_column:
            out.append(F.when(F.col(_BAD), F.col(_RAW)).otherwise(F.lit(None).cast("string"))
                       .alias(self.corrupt_column))
        return flat.select(*out)

    def _on_bad_records(self, rows: list, paths: list[str], declared) -> None:
        # Spark names each row's file by URI; map it back to the path it was given. One
        # read's files share a directory, so the name alone is a safe second key (a path
        # Spark spelled differently, e.g. through a symlink).
        full = {os.path.abspath(p): p for p in paths}
        named = {os.path.basename(p): p for p in paths}
        by_file: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for r in rows:
            local = _local_path(r[_FILE])
            path = full.get(local) or named.get(os.path.basename(local), local)
            by_file[path].append((r[_RAW], _reason(r, declared)))
        if by_file and self.mode == "FAILFAST":
            path, [(line, reason), *_] = next(iter(sorted(by_file.items())))
            raise MalformedRecordError(
                f"FileSource {self.name!r} (mode=FAILFAST): bad record in {os.path.basename(path)}: {reason}: "
                f"{line[:200]!r}. Fix or remove the file, or use mode='PERMISSIVE' with dead_letter=DIR to set "
                "bad records aside")
        counts = Counter({f: len(v) for f, v in by_file.items()})
        for path in paths:
            if path in self._counted:
                continue  # a replay after a restore: counted already in this run
            self._counted.add(path)
            self.malformed_records += counts[path]
            if self._metric is not None and counts[path]:
                self._metric.labels(self.name).inc(counts[path])
        if by_file and self._warn_null_rows:
            self._warn_passed_on(by_file)
        if self.dead_letter is not None:
            for path, bad in by_file.items():
                self._stage(path, bad)

    def _warn_passed_on(self, by_file: Mapping[str, list[tuple[str, str]]]) -> None:
        total = sum(len(bad) for bad in by_file.values())
        path, [(_line, reason), *_] = next(iter(sorted(by_file.items())))
        log.warning(
            "FileSource %r: %d bad record%s in this epoch (%s: %s%s) passed on as rows of nulls "
            "(Spark's mode=PERMISSIVE); set dead_letter=DIR to set them aside with their line and reason, "
            "mode='DROPMALFORMED' to drop them, mode='FAILFAST' to stop, or mode='PERMISSIVE' to keep "
            "them and silence this warning", self.name, total, "" if total == 1 else "s",
            os.path.basename(path), reason, f"; {len(by_file) - 1} more file(s)" if len(by_file) > 1 else "")

    def _dead_letter_name(self, path: str) -> str:
        """`<input file name>.<id>.parquet`: readable, and unique per source and input
        file (a name alone collides with a same-named file elsewhere)."""
        identity = hashlib.sha256(f"{self.name}\0{os.path.abspath(path)}".encode()).hexdigest()[:16]
        return f"{os.path.basename(path)}.{identity}.parquet"

    def _stage(self, path: str, bad: list[tuple[str, str]]) -> None:
        staging = os.path.join(self.dead_letter, "_staging")
        os.makedirs(staging, exist_ok=True)
        name = self._dead_letter_name(path)
        if os.path.exists(os.path.join(self.dead_letter, name)) or self._published_by_older_version(path):
            return  # published by a checkpoint already
        table = pa.table({"source": [self.name] * len(bad), "file": [os.path.abspath(path)] * len(bad),
                          "line": [b[0] for b in bad], "reason": [b[1] for b in bad]}, schema=DEAD_LETTER_SCHEMA)
        tmp = os.path.join(staging, f".{name}.{uuid.uuid4().hex}.tmp")
        pq.write_table(table, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        # A replay stages the same rows under the same name: replacing is idempotent.
        os.replace(tmp, os.path.join(staging, name))

    def _published_by_older_version(self, path: str) -> bool:
        """A dead-letter file of this source named after the input file only."""
        legacy = os.path.join(self.dead_letter, f"{os.path.basename(path)}.parquet")
        if not os.path.exists(legacy):
            return False
        return set(pq.read_table(legacy, columns=["source"]).column("source").to_pylist()) == {self.name}

    def _publish(self, positions: Positions) -> None:
        if self.dead_letter is None:
            return
        staging = os.path.join(self.dead_letter, "_staging")
        if not os.path.isdir(staging):
            return
        staged = set(os.listdir(staging))
        for file in sorted(_done(positions)):
            name = self._dead_letter_name(os.path.join(self.path, file))
            if name in staged:
                os.replace(os.path.join(staging, name), os.path.join(self.dead_letter, name))
            # Staged by a version that named dead letters after the input file only.
            legacy = f"{file}.parquet"
            if legacy in staged:
                if name in staged or os.path.exists(os.path.join(self.dead_letter, name)):
                    os.remove(os.path.join(staging, legacy))   # staged again since, under the new name
                else:
                    os.replace(os.path.join(staging, legacy), os.path.join(self.dead_letter, legacy))

    def notify_checkpoint_complete(self, checkpoint_id: int, positions: Positions) -> None:
        self._publish(positions)

    def close(self) -> None:
        if self._cached is not None:
            try:
                self._cached.unpersist()
            except Exception:  # the session may be gone at shutdown
                pass
            self._cached = None


_COUNTERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_COUNTERS_LOCK = threading.Lock()


def malformed_counter(registry: Any):
    """One counter per registry: a registry refuses a second collector of the same name."""
    from prometheus_client import Counter as PromCounter

    with _COUNTERS_LOCK:
        counter = _COUNTERS.get(registry)
        if counter is None:
            counter = _COUNTERS[registry] = PromCounter(
                "sparkpoint_source_malformed_records", "Bad input records (not JSON, a value of the wrong "
                "type, a missing NOT NULL field), each counted once per run", ["source"], registry=registry)
        return counter


def _reason(row, declared) -> str:
    """Why a line is bad, in the user's words (computed on the driver, bad rows only)."""
    line = row[_RAW]
    try:
        obj = json.loads(line)
    except ValueError as e:
        # Some of json's messages end with "at" already ("Unterminated string starting at").
        message = str(getattr(e, "msg", e)).removesuffix(" at")
        return f"malformed JSON: {message} at column {getattr(e, 'colno', '?')}"
    if not isinstance(obj, dict):
        return f"not a JSON object: {type(obj).__name__}"
    problems = []
    for f in declared.fields:
        given = obj.get(f.name)
        if f.name in obj and given is not None and row[f.name] is None:
            problems.append(f"field {f.name!r}: {given!r} is not a {f.dataType.simpleString().upper()}")
        elif given is None and not f.nullable:
            problems.append(f"missing field {f.name!r} (declared NOT NULL)" if f.name not in obj
                            else f"field {f.name!r} is null (declared NOT NULL)")
    return "; ".join(problems) or "does not match the schema"


def _local_path(uri: str) -> str:
    """The local path of what input_file_name() returns: a URI, "a b.json" as "a%20b.json"."""
    parsed = urlparse(uri)
    return os.path.abspath(unquote(parsed.path if parsed.scheme in ("file", "") else uri))


def _done(positions: Positions) -> set[str]:
    """Names already read, from this version's positions or an older run's."""
    return set(positions.get(_SPLIT, positions.get(_LEGACY_SPLIT, [])))
