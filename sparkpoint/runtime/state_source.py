"""Which completed checkpoint a state read means, and where its files are. Driver
side: reads `_metadata` only (through `sparkpoint.storage.metadata`), never a state
file.

A path is one of
  - a checkpoint directory `<root>/<job>/chk-N`: handle paths are relative to the job
    directory (the parent);
  - a job's checkpoint namespace `<root>/<job>`: its latest completed checkpoint that
    reads cleanly;
  - a savepoint directory: `_metadata` whose properties say `"savepoint": true` (or,
    for readers of a metadata version that does not carry the flag, a directory with
    `_metadata` and `shared/` that is not a `chk-N`), holding copies of the files
    under the same relative paths, so handle paths are relative to it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.errors import CorruptCheckpointError, ForeignCheckpointError, NoValidCheckpointError
from sparkpoint.state.changelog import Lineage, is_lineage_handle
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.ids import list_checkpoint_ids
from sparkpoint.storage.layout import METADATA_FILE, SHARED_DIR, JobLayout, parse_checkpoint_dir_name
from sparkpoint.storage.metadata import decode, read_completed

log = logging.getLogger(__name__)
STATE_PREFIX = "state:"
# Where a runtime that records its operators' state schemas puts it in a state
# handle (sparkpoint.state.descriptor JSON); a reader then needs no operator object.
SCHEMA_KEY = "state_schema"


@dataclass(frozen=True)
class StateSource:
    path: str                          # as the user gave it
    files_url: str                     # handle paths are relative to this
    checkpoint: CompletedCheckpointData
    savepoint: bool

    def operators(self) -> dict[str, list[tuple[Lineage, Mapping[str, Any]]]]:
        """Operator name -> its subtasks' (lineage, raw handle), by subtask."""
        found: dict[str, list[tuple[Lineage, Mapping[str, Any]]]] = {}
        for participant, handle in self.checkpoint.handles.items():
            if participant.startswith(STATE_PREFIX) and is_lineage_handle(handle):
                lineage = Lineage.from_json(handle)
                found.setdefault(lineage.operator, []).append((lineage, handle))
        return {op: sorted(subtasks, key=lambda t: t[0].subtask) for op, subtasks in sorted(found.items())}

    @property
    def what(self) -> str:
        kind = "savepoint" if self.savepoint else f"checkpoint {self.checkpoint.checkpoint_id}"
        return f"{kind} at {self.path}"


def _url(path: str) -> str:
    return path if "://" in path else os.path.abspath(path)


def open_state_source(path: str, storage_options: Mapping[str, Any] | None = None) -> StateSource:
    options = dict(storage_options or {})
    fs = StorageFS.from_url(_url(path), options)
    root = fs.root
    name = root.rsplit("/", 1)[-1]
    chk_id = parse_checkpoint_dir_name(name)
    metadata = f"{root}/{METADATA_FILE}"
    if fs.exists(metadata):
        if chk_id is not None:
            parent = root.rsplit("/", 1)[0]
            data = read_completed(fs, JobLayout(parent), chk_id)
            if data is None:
                raise NoValidCheckpointError(f"{path} has no _metadata: the checkpoint never completed")
            if not getattr(data.properties, "savepoint", False):
                return StateSource(path, fs.fs.unstrip_protocol(parent), data, savepoint=False)
        else:
            data = decode(fs.read_bytes(metadata), None, metadata)
        if getattr(data.properties, "savepoint", False) or fs.exists(f"{root}/{SHARED_DIR}"):
            return StateSource(path, fs.fs.unstrip_protocol(root), data, savepoint=True)
        raise ForeignCheckpointError(
            f"{path} holds a _metadata but is neither a checkpoint directory (chk-N) nor a savepoint (its "
            "properties do not say savepoint and it has no shared/ directory); point at the job's checkpoint "
            "directory, one of its chk-N, or a savepoint")
    return _latest(fs, path, root)


def _latest(fs: StorageFS, path: str, root: str) -> StateSource:
    layout = JobLayout(root)
    skipped = []
    for chk_id in reversed(list_checkpoint_ids(fs, layout)):
        try:
            data = read_completed(fs, layout, chk_id)
        except (CorruptCheckpointError, ForeignCheckpointError) as e:
            log.warning("state reader: skipping chk-%d: %s", chk_id, e)
            skipped.append(f"chk-{chk_id}: {e}")
            continue
        if data is not None:
            return StateSource(path, fs.fs.unstrip_protocol(root), data, savepoint=False)
    detail = f" (unreadable: {'; '.join(skipped)})" if skipped else ""
    raise NoValidCheckpointError(
        f"{path} holds no completed checkpoint{detail}; give a job's checkpoint directory "
        "(<execution.checkpointing.dir>/<job name>), one of its chk-N directories, or a savepoint")
