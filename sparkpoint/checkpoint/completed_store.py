"""The completed checkpoints this job keeps: a bounded LIFO, newest last. Savepoints
never enter it: they are not restored from on a failover and are not subject to
retention (docs/savepoints.md)."""

from __future__ import annotations

import threading
from typing import Iterable

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData, StateHandle


class CompletedCheckpointStore:
    """Keeps the newest `num_retained` completed checkpoints.

    `add` hands back the checkpoints it pushed out; the coordinator deletes their
    files only after the new checkpoint is durable, and tells storage which handles
    the retained ones still reference (shared files of incremental checkpoints).
    """

    def __init__(self, num_retained: int) -> None:
        if num_retained < 1:
            raise ValueError(f"num_retained must be >= 1, got {num_retained}")
        self.num_retained = num_retained
        self._checkpoints: list[CompletedCheckpointData] = []  # oldest first
        self._lock = threading.Lock()

    def add(self, checkpoint: CompletedCheckpointData) -> list[CompletedCheckpointData]:
        """Add the newest checkpoint; return the subsumed ones, oldest first.
        Raises ValueError if it is not newer than the latest (ids only go up), or if it
        is a savepoint (it would push a checkpoint out of retention)."""
        if checkpoint.properties.savepoint:
            raise ValueError(f"savepoint {checkpoint.checkpoint_id} cannot enter the completed "
                             "checkpoint store: savepoints do not count against checkpoint retention")
        with self._lock:
            if self._checkpoints and checkpoint.checkpoint_id <= self._checkpoints[-1].checkpoint_id:
                raise ValueError(
                    f"checkpoint {checkpoint.checkpoint_id} is not newer than the latest "
                    f"completed checkpoint {self._checkpoints[-1].checkpoint_id}")
            self._checkpoints.append(checkpoint)
            excess = len(self._checkpoints) - self.num_retained
            if excess <= 0:
                return []
            subsumed, self._checkpoints = self._checkpoints[:excess], self._checkpoints[excess:]
            return subsumed

    def recover(self, checkpoints: Iterable[CompletedCheckpointData]) -> None:
        """Replace the contents with what storage holds. All are kept, even beyond
        `num_retained`: if the latest turns out unusable on restore, the runtime falls
        back to an older one. The next `add` trims to `num_retained`. Savepoints among
        them are left out."""
        ordered = sorted((c for c in checkpoints if not c.properties.savepoint), key=lambda c: c.checkpoint_id)
        with self._lock:
            self._checkpoints = ordered

    def latest(self) -> CompletedCheckpointData | None:
        with self._lock:
            return self._checkpoints[-1] if self._checkpoints else None

    def all(self) -> list[CompletedCheckpointData]:
        """Oldest first."""
        with self._lock:
            return list(self._checkpoints)

    def retained_handles(self) -> list[StateHandle]:
        """Every state handle the retained checkpoints reference."""
        with self._lock:
            return [h for c in self._checkpoints for h in c.handles.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._checkpoints)
