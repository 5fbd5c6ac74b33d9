"""Durable checkpoint ids: never reused, never backward (seed 002).

`_ids` holds the highest id ever handed out, as JSON. It is rewritten (atomically)
before an id is returned, so a crash right after can only skip an id, never reuse one.
`start()` also scans the `chk-*` directories and continues past the highest of them,
so a lost, stale or damaged `_ids` cannot make a new run collide with old directories.
"""

from __future__ import annotations

import json
import logging
import threading

from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout, parse_checkpoint_dir_name

log = logging.getLogger(__name__)

IDS_FORMAT = "sparkpoint-ids"


def encode_ids(highest_used: int) -> bytes:
    return json.dumps({"format": IDS_FORMAT, "version": 1, "highest_used": highest_used}).encode()


def read_highest_used(fs: StorageFS, layout: JobLayout) -> int | None:
    """The id recorded in `_ids`; None if the file is missing or unreadable (logged)."""
    if not fs.exists(layout.ids):
        return None
    raw = fs.read_bytes(layout.ids)
    try:
        doc = json.loads(raw)
        value = doc["highest_used"]
        if doc.get("format") != IDS_FORMAT or not isinstance(value, int) or value < 0:
            raise ValueError(f"unexpected content {doc!r:.200}")
        return value
    except (ValueError, KeyError, TypeError) as e:
        log.warning("%s is unreadable (%s); continuing past the highest chk-* directory instead",
                    layout.ids, e)
        return None


def list_checkpoint_ids(fs: StorageFS, layout: JobLayout) -> list[int]:
    """Ids of every `chk-<id>` directory present, completed or not, ascending."""
    return sorted(i for i in (parse_checkpoint_dir_name(n) for n in fs.ls(layout.root)) if i is not None)


def highest_checkpoint_dir_id(fs: StorageFS, layout: JobLayout) -> int:
    """The highest `chk-<id>` directory present, completed or not; 0 if none."""
    return max(list_checkpoint_ids(fs, layout), default=0)


class DurableCheckpointIDCounter:
    """CheckpointIDCounter backed by `<job>/_ids`. Thread-safe.

    Raises StorageError from `get_and_increment`/`set_count` if `_ids` cannot be written:
    the id is then not handed out."""

    def __init__(self, fs: StorageFS, layout: JobLayout):
        self._fs = fs
        self._layout = layout
        self._lock = threading.RLock()
        self._highest_used: int | None = None

    def start(self) -> None:
        with self._lock:
            recorded = read_highest_used(self._fs, self._layout) or 0
            on_disk = highest_checkpoint_dir_id(self._fs, self._layout)
            self._highest_used = max(recorded, on_disk, self._highest_used or 0)
            if on_disk > recorded:
                log.warning("%s records id %d but chk-%d exists; continuing from %d",
                            self._layout.ids, recorded, on_disk, on_disk + 1)
                self._persist(self._highest_used)

    def get_and_increment(self) -> int:
        with self._lock:
            highest = self._ensure_started()
            # Re-read: if anything else advanced `_ids` (it should not, under the lease),
            # follow it rather than hand out an id it already used.
            highest = max(highest, read_highest_used(self._fs, self._layout) or 0)
            next_id = highest + 1
            self._persist(next_id)
            self._highest_used = next_id
            return next_id

    def get(self) -> int:
        with self._lock:
            return self._ensure_started() + 1

    def set_count(self, next_id: int) -> None:
        with self._lock:
            highest = self._ensure_started()
            if next_id - 1 > highest:
                self._persist(next_id - 1)
                self._highest_used = next_id - 1

    def shutdown(self) -> None:
        """Nothing to flush: every id was persisted before it was returned."""

    def _ensure_started(self) -> int:
        if self._highest_used is None:
            self.start()
        assert self._highest_used is not None
        return self._highest_used

    def _persist(self, highest_used: int) -> None:
        self._fs.write_atomic(self._layout.ids, encode_ids(highest_used))
