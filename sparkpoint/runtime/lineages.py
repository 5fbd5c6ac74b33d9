"""The driver's view of where each subtask's state lives durably (its lineage:
snapshot + change logs, sparkpoint/state/changelog.py). Updated from the tasks'
meta rows every epoch; handed to the tasks of the next epoch; recorded as the state
participants' handles at a checkpoint barrier; taken from a checkpoint on restore.
The driver never touches a state file: it only moves these small descriptions.

Thread-safety: the epoch loop updates it; the coordinator's threads read
`live_handles()` (files the running job still needs) under the same lock.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from sparkpoint.state.changelog import NO_EPOCH, ChangelogFile, Lineage
from sparkpoint.state.keys import key_group_range

log = logging.getLogger(__name__)


@dataclass
class MoveStats:
    """How often subtasks ran on an executor without their state, and what it cost."""

    tasks: int = 0
    local: int = 0
    retries: int = 0
    catch_ups: int = 0
    rebuilds: int = 0
    rebuild_ms: list[int] = field(default_factory=list)
    replayed: int = 0
    bytes_downloaded: int = 0
    snapshots: int = 0
    snapshot_bytes: int = 0
    executors: dict[int, str] = field(default_factory=dict)  # subtask -> where it ran last
    moves: int = 0

    def to_json(self) -> dict[str, Any]:
        ms = sorted(self.rebuild_ms)
        return {"tasks": self.tasks, "local": self.local, "retries": self.retries, "catch_ups": self.catch_ups,
                "rebuilds": self.rebuilds, "moves": self.moves, "replayed_changelogs": self.replayed,
                "rebuild_ms_p50": ms[len(ms) // 2] if ms else None, "rebuild_ms_max": ms[-1] if ms else None,
                "bytes_downloaded": self.bytes_downloaded, "snapshots": self.snapshots,
                "snapshot_bytes_uploaded": self.snapshot_bytes}


class Lineages:
    def __init__(self, operator: str, parallelism: int, max_parallelism: int, *, materialize_interval_ms: int,
                 max_changelogs: int, clock: Callable[[], float] = time.monotonic):
        self.operator = operator
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self._interval_s = materialize_interval_ms / 1000
        self._max_changelogs = max_changelogs
        self._clock = clock
        self._lock = threading.Lock()
        self._lineages: dict[int, Lineage] = {}
        self._last_snapshot: dict[int, float] = {}
        # (epoch, paths): files a snapshot made unnecessary for the live lineage at that epoch
        self._dropped: list[tuple[int, list[str]]] = []
        self.stats = MoveStats()
        # Begins at every fresh start and every restore. The same epoch number is planned
        # again over another slice after a failover: local stores of an earlier
        # generation are never used, and a retry must be of this one (executor/store_opening.py).
        self.generation = ""
        self.reset_empty()

    # -- restore -------------------------------------------------------------------
    def reset_empty(self, epoch: int = NO_EPOCH) -> None:
        """Empty state; `epoch`: as of the end of that epoch (a step new in the graph of a
        restored job starts empty at the restored epoch, so its change logs follow on)."""
        with self._lock:
            self._lineages = {}
            for i in range(self.parallelism):
                kg = key_group_range(i, self.parallelism, self.max_parallelism)
                self._lineages[i] = Lineage(self.operator, i, (kg.start, kg.stop), self.max_parallelism,
                                            epoch=epoch, base_epoch=epoch)
            self._last_snapshot = {i: self._clock() for i in range(self.parallelism)}
            self._dropped = []
            self.generation = uuid.uuid4().hex[:12]

    def restore(self, handles: Mapping[int, Mapping[str, Any]], generation: str | None = None) -> None:
        """Take the lineages of a checkpoint (validated: CorruptSnapshotError if not).
        A new generation begins, or `generation`: the one a re-cut of the state began
        before its tasks built the stores these lineages describe."""
        restored = {i: Lineage.from_json(h) for i, h in handles.items()}
        with self._lock:
            self._lineages = restored
            self._last_snapshot = {i: self._clock() for i in restored}
            self._dropped = []
            self.generation = generation or uuid.uuid4().hex[:12]

    # -- each epoch ----------------------------------------------------------------
    def for_tasks(self) -> dict[int, Lineage]:
        with self._lock:
            return dict(self._lineages)

    def due_for_snapshot(self) -> frozenset[int]:
        now = self._clock()
        with self._lock:
            return frozenset(i for i, lin in self._lineages.items()
                             if len(lin.changelog) >= self._max_changelogs
                             or (lin.changelog and now - self._last_snapshot.get(i, now) >= self._interval_s))

    def on_epoch(self, epoch: int, infos: Mapping[int, Mapping[str, Any]]) -> None:
        """Record what each subtask reported for `epoch` (its change log, maybe a snapshot)."""
        with self._lock:
            for i, info in infos.items():
                lin = self._lineages[i]
                state = info.get("state") or {}
                if state.get("durable_refs"):
                    lin = lin.mark_durable(state["durable_refs"])
                entry = info.get("changelog")
                if entry is None:
                    raise RuntimeError(f"subtask {i} of {self.operator} reported no change log for epoch {epoch}")
                lin = lin.advance(ChangelogFile.from_json(entry, f"epoch {epoch}"))
                snap = info.get("snapshot")
                if snap is not None:
                    before = {f.path for f in lin.files()}
                    lin = lin.rebased(snap, int(snap["epoch"]))
                    self._dropped.append((epoch, sorted(before - {f.path for f in lin.files()})))
                    self._last_snapshot[i] = self._clock()
                    self.stats.snapshots += 1
                    self.stats.snapshot_bytes += int(snap.get("bytes_uploaded", 0))
                elif info.get("snapshot_error"):
                    log.warning("subtask %d of %s could not upload a state snapshot (%s); it keeps its change "
                                "logs and tries again", i, self.operator, info["snapshot_error"])
                self._lineages[i] = lin
                self._count(i, info, state)

    def on_restore(self, infos: Mapping[int, Mapping[str, Any]]) -> None:
        """Reports of the restore job (each subtask rebuilt on some executor)."""
        with self._lock:
            for i, info in infos.items():
                self._count(i, info, info.get("state") or {})

    def _count(self, i: int, info: Mapping[str, Any], state: Mapping[str, Any]) -> None:
        s = self.stats
        s.tasks += 1
        how = state.get("how", "local")
        s.local += how == "local"
        s.retries += how == "retry"
        s.catch_ups += how == "catch-up"
        if how == "rebuild":
            s.rebuilds += 1
            s.rebuild_ms.append(int(state.get("rebuild_ms", 0)))
        s.replayed += int(state.get("replayed", 0))
        if state.get("corrupt_local"):
            log.error("ALARM state:%s/%d: the local recovery copy was corrupt (%s); those files were restored from "
                      "checkpoint storage instead", self.operator, i, ", ".join(state["corrupt_local"]))
        s.bytes_downloaded += int(state.get("bytes_downloaded", 0))
        where = str(info.get("executor"))
        if s.executors.get(i) not in (None, where):
            s.moves += 1  # ran on another executor than last epoch
            log.info("subtask %d of %s moved to executor %s (state %s: %s; %d change logs replayed, %s ms)", i,
                     self.operator, where, how, state.get("why") or "?", int(state.get("replayed", 0)),
                     state.get("rebuild_ms", 0))
        s.executors[i] = where

    # -- checkpoints -----------------------------------------------------------------
    def handle(self, subtask: int) -> tuple[dict[str, Any] | None, str | None]:
        """(the state handle of `subtask` now, or None with the reason it has none)."""
        with self._lock:
            lin = self._lineages[subtask]
        if not lin.durable:
            return None, (f"the change logs of epochs {[c.epoch for c in lin.pending]} are not in checkpoint "
                          "storage yet (it refused them); they are retried every epoch")
        return lin.to_json(), None

    def take_unneeded(self, up_to_epoch: int) -> list[str]:
        """Files a snapshot made unnecessary at or before `up_to_epoch`: a checkpoint whose
        barrier is at that epoch or later no longer references them, nor does the running
        job. The caller deletes those no retained checkpoint references."""
        with self._lock:
            taken = [p for e, paths in self._dropped if e <= up_to_epoch for p in paths]
            self._dropped = [(e, paths) for e, paths in self._dropped if e > up_to_epoch]
            return taken

    def live_handles(self) -> list[dict[str, Any]]:
        """Handles of the state the running job still needs (for the garbage collector)."""
        with self._lock:
            return [lin.to_json() for lin in self._lineages.values()]
