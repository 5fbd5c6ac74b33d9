"""A directory-of-files source: JSON lines or Parquet, new files picked up as
they arrive. Files are taken in name order; the position is the list of files
already read, so a restore never re-reads or skips one. Files must be complete
when they appear (write elsewhere, then rename into the directory).

The one split is "dir". Runs before this name used "files", which is also the key
under which checkpoint handles list state files (storage/handles.py); positions
of such older checkpoints are still read."""

from __future__ import annotations

import fnmatch
import os

from sparkpoint.connectors.base import Positions, SlicePlan, Source, SourceContext
from sparkpoint.errors import ConfigError

_SPLIT = "dir"
_LEGACY_SPLIT = "files"  # the split of checkpoints written by older versions


class FileSource(Source):
    def __init__(self, path: str, *, format: str = "json", schema: str, name: str = "files",
                 max_files_per_epoch: int = 10, pattern: str | None = None, bounded: bool = False):
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
        self._spark = None

    @property
    def schema(self) -> str:
        return self._schema

    def open(self, ctx: SourceContext) -> None:
        self._spark = ctx.spark

    def initial_positions(self) -> Positions:
        return {_SPLIT: []}

    def _available(self) -> list[str]:
        if not os.path.isdir(self.path):
            return []
        return sorted(n for n in os.listdir(self.path)
                      if fnmatch.fnmatch(n, self.pattern) and not n.startswith((".", "_")))

    def plan(self, positions: Positions) -> SlicePlan:
        done = _done(positions)
        new = [n for n in self._available() if n not in done][: self.max_files]
        return SlicePlan({_SPLIT: sorted(done)}, {_SPLIT: sorted(done | set(new))})

    def is_exhausted(self, positions: Positions) -> bool:
        return self.bounded and not self.lag(positions)[_SPLIT]

    def lag(self, positions: Positions) -> dict[str, int]:
        done = _done(positions)
        return {_SPLIT: sum(1 for n in self._available() if n not in done)}

    def read(self, plan: SlicePlan):
        new = sorted(_done(plan.end) - _done(plan.start))
        if not new:
            return self._spark.createDataFrame([], self._schema)
        paths = [os.path.join(self.path, n) for n in new]
        reader = self._spark.read.schema(self._schema)
        return reader.json(paths) if self.format == "json" else reader.parquet(*paths)


def _done(positions: Positions) -> set[str]:
    """Names already read, from this version's positions or an older run's."""
    return set(positions.get(_SPLIT, positions.get(_LEGACY_SPLIT, [])))
