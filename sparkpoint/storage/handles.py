"""The files a state handle references.

Convention shared by every participant: anywhere inside a handle (nested dicts and
lists) a key "files" may hold a list of file entries

    {"path": "shared/state/windows/3/ab12..-000012.sst", "size": 1234,
     "sha256": "<hex>", "shared": true, "name": "000012.sst"}

`path` is relative to the job directory. Shared files live under `shared/` and may be
referenced by many checkpoints; exclusive files live under `chk-<id>/`.

Only values that are such entries count: a dict whose "path" is a string inside the
checkpoint storage (`shared/...` or `chk-<id>/...`). Other participants may use a
"files" key for their own things (a source's list of file names it has read, a sink's
files relative to its output directory); those are not checkpoint files and are
skipped, never an error, so listing, verifying and discarding such a checkpoint works.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

from sparkpoint.errors import CorruptCheckpointError

FILES_KEY = "files"
# First path component of a file that checkpoint storage owns (see storage/layout.py).
_STORAGE_TOP = re.compile(r"shared|chk-\d+")


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str
    shared: bool
    name: str

    @classmethod
    def from_json(cls, entry: Any) -> "FileEntry":
        if not is_file_entry(entry):
            raise CorruptCheckpointError(
                "not a state file entry (a dict whose 'path' lies under shared/ or chk-<id>/ "
                f"of the job directory): {entry!r:.200}")
        size = entry.get("size", -1)
        return cls(
            path=entry["path"],
            size=size if isinstance(size, int) and not isinstance(size, bool) else -1,
            sha256=str(entry.get("sha256") or ""),
            shared=bool(entry.get("shared", False)),
            name=str(entry.get("name", entry["path"].rsplit("/", 1)[-1])),
        )


def is_file_entry(value: Any) -> bool:
    """True for a file entry of checkpoint storage: a dict with a string "path" whose
    first component is `shared` or `chk-<id>`. Size and sha256 are optional here (an
    entry without them still keeps its file from being deleted); a path that tries to
    leave the job directory ("shared/../..") is still an entry, and `JobLayout.resolve`
    refuses it wherever it would be used."""
    if not isinstance(value, Mapping):
        return False
    path = value.get("path")
    if not isinstance(path, str) or "/" not in path:
        return False
    return bool(_STORAGE_TOP.fullmatch(path.split("/", 1)[0]))


def iter_file_entries(handle: Any) -> Iterator[FileEntry]:
    """Every state file entry anywhere inside one handle (or any JSON value): the values
    of "files" lists that are entries (`is_file_entry`); anything else is skipped."""
    if isinstance(handle, Mapping):
        for key, value in handle.items():
            if key == FILES_KEY and isinstance(value, list):
                for entry in value:
                    if is_file_entry(entry):
                        yield FileEntry.from_json(entry)
                    else:
                        yield from iter_file_entries(entry)
            else:
                yield from iter_file_entries(value)
    elif isinstance(handle, list | tuple):
        for value in handle:
            yield from iter_file_entries(value)


def referenced_paths(handles: Iterable[Any]) -> set[str]:
    """Job-relative paths of every file the given handles reference."""
    return {entry.path for handle in handles for entry in iter_file_entries(handle)}


def checkpoint_file_entries(handles: Mapping[str, Any]) -> list[FileEntry]:
    """File entries of one checkpoint (its participant -> handle map), deduplicated by path."""
    unique: dict[str, FileEntry] = {}
    for handle in handles.values():
        for entry in iter_file_entries(handle):
            unique.setdefault(entry.path, entry)
    return [unique[p] for p in sorted(unique)]
