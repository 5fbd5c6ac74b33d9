"""The files a state handle references.

Convention shared by every participant: anywhere inside a handle (nested dicts and
lists) a key "files" may hold a list of file entries

    {"path": "shared/state/windows/3/ab12..-000012.sst", "size": 1234,
     "sha256": "<hex>", "shared": true, "name": "000012.sst"}

`path` is relative to the job directory. Shared files live under `shared/` and may be
referenced by many checkpoints; exclusive files live under `chk-<id>/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

from sparkpoint.errors import CorruptCheckpointError

FILES_KEY = "files"


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str
    shared: bool
    name: str

    @classmethod
    def from_json(cls, entry: Any) -> "FileEntry":
        if not isinstance(entry, Mapping) or not isinstance(entry.get("path"), str):
            raise CorruptCheckpointError(
                f"a state handle lists a file entry without a string 'path': {entry!r:.200}")
        return cls(
            path=entry["path"],
            size=int(entry.get("size", -1)),
            sha256=str(entry.get("sha256", "")),
            shared=bool(entry.get("shared", False)),
            name=str(entry.get("name", entry["path"].rsplit("/", 1)[-1])),
        )


def iter_file_entries(handle: Any) -> Iterator[FileEntry]:
    """Every file entry anywhere inside one handle (or any JSON value)."""
    if isinstance(handle, Mapping):
        for key, value in handle.items():
            if key == FILES_KEY and isinstance(value, list):
                for entry in value:
                    yield FileEntry.from_json(entry)
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
