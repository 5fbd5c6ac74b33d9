"""Spark's file-sink metadata log (`<output>/_spark_metadata`), written without Spark.

When `<output>/_spark_metadata` exists, `spark.read.parquet(output)` reads only the files
this log names (Spark's `MetadataLogFileIndex`), never a directory listing. So writing a
batch file of the log is the commit point for Spark readers, on any filesystem, with no
rename.

The format is Spark's `FileStreamSinkLog` (version 1), read back by Spark 3 and 4:

- batch `b` is the file `b`, or `b.compact` when `(b + 1) % interval == 0`;
- its content is `v1`, then per data file `\\n` + one JSON object: `path` (a fully
  qualified, percent-encoded URI), `size`, `isDir`, `modificationTime` (ms),
  `blockReplication`, `blockSize`, `action` (`add`);
- a compact batch holds every entry of the batches before it, so the files of the log
  are those of the latest compact batch plus those of the batches after it.

Spark 4 no longer honours `"delete"` entries, so files are withdrawn (`rewrite`) by writing
empty batches up to the next compact batch id, and that compact batch without them.

The interval is Spark's (`spark.sql.streaming.fileSink.log.compactInterval`, default 10);
once compact batches exist it is derived from their ids exactly as Spark derives it, so
writer and readers agree. Batch files are created exclusively (never overwritten).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Iterable
from urllib.parse import quote, unquote, urlsplit

from sparkpoint.errors import SparkpointError
from sparkpoint.storage.fs import StorageFS

log = logging.getLogger(__name__)

LOG_DIR = "_spark_metadata"
DEFAULT_INTERVAL = 10
VERSION_LINE = "v1"
COMPACT = ".compact"
_BATCH_NAME = re.compile(r"^(\d+)(\.compact)?$")
_BLOCK_SIZE = 32 * 1024 * 1024
# Characters Hadoop's Path.toUri leaves unescaped in a path.
_URI_SAFE = "/:@&=+$,;!~*'()"


class OutputLogError(SparkpointError):
    """The output's `_spark_metadata` log is unreadable (a batch file is missing or not
    in Spark's format). The message names the file. The log was changed outside
    sparkpoint; restore the file from a backup or start a new output directory."""


def is_compaction_batch(batch_id: int, interval: int) -> bool:
    return (batch_id + 1) % interval == 0


def next_compaction_batch(batch_id: int, interval: int) -> int:
    return (batch_id + interval + 1) // interval * interval - 1


def valid_batches(latest: int, interval: int) -> range:
    """The batches a reader reads at `latest`: the compact batch before it, and on."""
    return range(max(0, (latest + 1) // interval * interval - 1), latest + 1)


def derive_interval(default: int, compact_ids: list[int]) -> int:
    """The interval Spark uses for a log holding compact batches `compact_ids`."""
    ids = sorted(compact_ids, reverse=True)
    if len(ids) >= 2:
        return ids[0] - ids[1]
    if len(ids) == 1:
        n = ids[0] + 1
        if n <= default:
            return n
        if default < n // 2:
            return next(i for i in [*range(default, n // 2 + 1), n] if n % i == 0)
        return n
    return default


def batch_name(batch_id: int, interval: int) -> str:
    return f"{batch_id}{COMPACT}" if is_compaction_batch(batch_id, interval) else str(batch_id)


@dataclass(frozen=True)
class LogState:
    """The log as of batch `latest` (-1: no batch yet): the entries readers see."""

    latest: int
    interval: int
    entries: tuple[dict[str, Any], ...]

    @property
    def uris(self) -> set[str]:
        return {e["path"] for e in self.entries}


def entry(uri: str, size: int, modified_ms: int | None = None) -> dict[str, Any]:
    return {"path": uri, "size": int(size), "isDir": False,
            "modificationTime": int(time.time() * 1000) if modified_ms is None else int(modified_ms),
            "blockReplication": 1, "blockSize": _BLOCK_SIZE, "action": "add"}


def encode(entries: Iterable[dict[str, Any]]) -> bytes:
    return "".join([VERSION_LINE, *("\n" + json.dumps(e, separators=(",", ":")) for e in entries)]).encode()


def decode(data: bytes, where: str) -> list[dict[str, Any]]:
    lines = data.decode("utf-8").split("\n")
    if lines[0] != VERSION_LINE:
        raise OutputLogError(f"{where} is not a Spark file sink log batch of version 1 "
                             f"(first line {lines[0][:20]!r})")
    try:
        out = [json.loads(line) for line in lines[1:] if line]
    except ValueError as e:
        raise OutputLogError(f"{where} holds a line that is not JSON: {e}") from e
    if not all(isinstance(e, dict) and isinstance(e.get("path"), str) for e in out):
        raise OutputLogError(f"{where} holds an entry without a path")
    return out


class SparkFileLog:
    """The log directory `<root>/_spark_metadata` on `storage` (any fsspec filesystem with
    exclusive create). `scheme` is the URI scheme Spark readers use for `root`
    (`file`, `s3a`, ...): entry paths are `<scheme>://<root>/<relative path>`."""

    def __init__(self, storage: StorageFS, scheme: str, default_interval: int = DEFAULT_INTERVAL):
        if default_interval < 1:
            raise ValueError(f"compact interval must be positive, got {default_interval}")
        self.storage = storage
        self.scheme = scheme
        self.default_interval = default_interval
        self.dir = f"{storage.root}/{LOG_DIR}"

    # -- paths ---------------------------------------------------------------------
    def uri(self, relative: str) -> str:
        root = self.storage.root if self.storage.root.startswith("/") else "/" + self.storage.root
        if self.scheme == "file":
            return "file://" + quote(f"{root}/{relative}", safe=_URI_SAFE)
        return f"{self.scheme}:/" + quote(f"{root}/{relative}", safe=_URI_SAFE)

    def relative(self, uri: str) -> str | None:
        """The path of `uri` relative to the output root, or None when it lies elsewhere
        (any scheme: an `s3://` entry and an `s3a://` one name the same object)."""
        parts = urlsplit(uri)
        path = unquote(parts.path) if parts.scheme == "file" or not parts.netloc else \
            f"{parts.netloc}{unquote(parts.path)}"
        root = self.storage.root.lstrip("/")
        path = path.lstrip("/")
        if not path.startswith(root + "/"):
            return None
        return path[len(root) + 1:]

    # -- reading -------------------------------------------------------------------
    def exists(self) -> bool:
        return bool(self._batch_ids())

    def _batch_ids(self) -> dict[str, int]:
        return {n: int(m.group(1)) for n in self.storage.ls(self.dir) if (m := _BATCH_NAME.match(n))}

    def load(self) -> LogState:
        names = self._batch_ids()
        interval = derive_interval(self.default_interval,
                                   [i for n, i in names.items() if n.endswith(COMPACT)])
        latest = next((i for i in sorted(set(names.values()), reverse=True)
                       if batch_name(i, interval) in names), -1)
        entries: list[dict[str, Any]] = []
        if latest >= 0:
            for batch in valid_batches(latest, interval):
                path = f"{self.dir}/{batch_name(batch, interval)}"
                try:
                    data = self.storage.read_bytes(path)
                except FileNotFoundError as e:
                    raise OutputLogError(f"output log batch {path} is missing (latest batch {latest}, "
                                         f"compact interval {interval})") from e
                entries.extend(decode(data, path))
        return LogState(latest, interval, tuple(entries))

    # -- writing -------------------------------------------------------------------
    def append(self, state: LogState, new: list[dict[str, Any]]) -> LogState:
        """Write batch `state.latest + 1` adding `new`. Raises FileExistsError when that
        batch exists (another writer, or an earlier attempt of ours): reload and retry."""
        batch = state.latest + 1
        entries = (*state.entries, *new)
        if is_compaction_batch(batch, state.interval):
            self._create(batch, state.interval, entries)
        else:
            self._create(batch, state.interval, new)
        after = LogState(batch, state.interval, entries)
        self._cleanup(after)
        return after

    def rewrite(self, state: LogState, entries: list[dict[str, Any]]) -> LogState:
        """Make `entries` the log's whole content: empty batches up to the next compact
        batch id, then that compact batch holding only `entries`. Until the compact batch
        exists readers see the old content; a crash in between is finished by calling
        this again. Raises FileExistsError like `append`."""
        target = next_compaction_batch(state.latest, state.interval)
        for batch in range(state.latest + 1, target):
            self._create(batch, state.interval, ())
        self._create(target, state.interval, entries)
        after = LogState(target, state.interval, tuple(entries))
        self._cleanup(after)
        return after

    def _create(self, batch: int, interval: int, entries: Iterable[dict[str, Any]]) -> None:
        self.storage.create_exclusive(f"{self.dir}/{batch_name(batch, interval)}", encode(entries))

    def _cleanup(self, state: LogState) -> None:
        """After a compact batch C, delete the batches before the previous compact batch
        (C - interval): readers need only the latest compact batch and the ones after it;
        keeping the previous one lets a reader that listed the log a moment ago finish,
        and lets Spark derive the interval from two compact batches."""
        if not is_compaction_batch(state.latest, state.interval):
            return
        keep_from = state.latest - state.interval
        if keep_from <= 0:
            return
        for name, batch in self._batch_ids().items():
            if batch < keep_from:
                try:
                    self.storage.rm(f"{self.dir}/{name}")
                except Exception as e:  # a leftover batch file is harmless
                    log.warning("could not delete old output log batch %s/%s: %s", self.dir, name, e)
