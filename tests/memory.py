"""In-memory collaborators of the checkpoint coordinator, for tests and demos.

Each one records what the coordinator asked of it and can be told to fail, so a
test can drive every failure path without a filesystem or Spark.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from sparkpoint.checkpoint.interfaces import (
    CheckpointProperties,
    CompletedCheckpointData,
    ParticipantId,
    StateHandle,
)
from sparkpoint.errors import CheckpointIdCollision, MetadataExistsError, StorageError


class InMemoryIdCounter:
    """A `CheckpointIDCounter` in memory. `fail_next(n)` makes the next n
    `get_and_increment` calls raise StorageError, as a broken `_ids` file would."""

    def __init__(self, first_id: int = 1) -> None:
        self._next = first_id
        self._fail_next = 0
        self._lock = threading.Lock()
        self.started = False
        self.stopped = False

    def start(self) -> None:
        self.started = True

    def get_and_increment(self) -> int:
        with self._lock:
            if self._fail_next > 0:
                self._fail_next -= 1
                raise StorageError("injected: could not persist the checkpoint id counter")
            value = self._next
            self._next += 1
            return value

    def get(self) -> int:
        return self._next

    def set_count(self, next_id: int) -> None:
        with self._lock:
            self._next = max(self._next, next_id)

    def shutdown(self) -> None:
        self.stopped = True

    def fail_next(self, times: int = 1) -> None:
        self._fail_next = times


@dataclass(frozen=True)
class InMemoryLocation:
    checkpoint_id: int
    root: str = "mem://job"

    @property
    def path(self) -> str:
        return f"{self.root}/chk-{self.checkpoint_id}"


@dataclass
class _Failure:
    error: BaseException
    times: int  # -1 = every call


class InMemoryCheckpointStorage:
    """A `CheckpointStorage` in memory (with `highest_checkpoint_id`).

    - `directories`: ids with a `chk-<id>/`; `metadata`: committed checkpoints by id.
    - `seed_collision(ids)`: pretend directories of earlier runs exist for those ids.
    - `fail(op, error, times=1)`: the next `times` calls of `op` raise `error`
      (`times=-1`: every call). op is a method name, e.g. "commit_metadata".
    - `discarded_locations`, `discarded_completed` (id, still_referenced): what was deleted,
      in order; `events` records every call in order, for ordering assertions.
    """

    def __init__(self, completed: Iterable[CompletedCheckpointData] = (),
                 report_highest_id: bool = True) -> None:
        self.directories: set[int] = set()
        self.metadata: dict[int, CompletedCheckpointData] = {}
        for data in completed:
            self.directories.add(data.checkpoint_id)
            self.metadata[data.checkpoint_id] = data
        self.discarded_locations: list[int] = []
        self.discarded_completed: list[tuple[int, list[StateHandle]]] = []
        self.events: list[tuple[str, int | None]] = []
        self.report_highest_id = report_highest_id
        self._failures: dict[str, _Failure] = {}
        self._lock = threading.Lock()

    # -- test controls ------------------------------------------------------------
    def seed_collision(self, checkpoint_ids: Iterable[int]) -> None:
        self.directories.update(checkpoint_ids)

    def fail(self, op: str, error: BaseException | None = None, times: int = 1) -> None:
        self._failures[op] = _Failure(error or StorageError(f"injected: {op} failed"), times)

    def _maybe_fail(self, op: str) -> None:
        failure = self._failures.get(op)
        if failure is None:
            return
        if failure.times > 0:
            failure.times -= 1
            if failure.times == 0:
                del self._failures[op]
        raise failure.error

    # -- CheckpointStorage --------------------------------------------------------
    def initialize_location(self, checkpoint_id: int) -> InMemoryLocation:
        with self._lock:
            self.events.append(("initialize_location", checkpoint_id))
            self._maybe_fail("initialize_location")
            if checkpoint_id in self.directories:
                raise CheckpointIdCollision(f"chk-{checkpoint_id} already exists")
            self.directories.add(checkpoint_id)
            return InMemoryLocation(checkpoint_id)

    def commit_metadata(self, location: Any, data: CompletedCheckpointData) -> None:
        with self._lock:
            self.events.append(("commit_metadata", data.checkpoint_id))
            self._maybe_fail("commit_metadata")
            if data.checkpoint_id in self.metadata:
                raise MetadataExistsError(f"chk-{data.checkpoint_id}/_metadata already exists")
            self.metadata[data.checkpoint_id] = data

    def discard_location(self, checkpoint_id: int) -> None:
        with self._lock:
            self.events.append(("discard_location", checkpoint_id))
            self._maybe_fail("discard_location")
            self.directories.discard(checkpoint_id)
            self.discarded_locations.append(checkpoint_id)

    def discard_completed(self, checkpoint_id: int, still_referenced: Sequence[StateHandle]) -> None:
        with self._lock:
            self.events.append(("discard_completed", checkpoint_id))
            self._maybe_fail("discard_completed")
            self.metadata.pop(checkpoint_id, None)
            self.directories.discard(checkpoint_id)
            self.discarded_completed.append((checkpoint_id, list(still_referenced)))

    def load_completed(self) -> list[CompletedCheckpointData]:
        with self._lock:
            self.events.append(("load_completed", None))
            self._maybe_fail("load_completed")
            return [self.metadata[i] for i in sorted(self.metadata)]

    def highest_checkpoint_id(self) -> int | None:
        self._maybe_fail("highest_checkpoint_id")
        if not self.report_highest_id:
            return None
        return max(self.directories, default=None)


@dataclass
class TriggerCall:
    checkpoint_id: int
    timestamp_ms: int
    location: Any
    properties: CheckpointProperties


@dataclass
class RecordingGateway:
    """A `ParticipantGateway` that records calls.

    `abort` returns a Future; by default it completes at once (writers stopped). Set
    `complete_aborts=False` to get pending futures in `abort_futures[id]` and complete
    them by hand, simulating snapshot writers that are still running (seed 000)."""

    participant_ids: list[ParticipantId] = field(default_factory=lambda: ["job", "state:op/0"])
    not_ready_ids: list[ParticipantId] = field(default_factory=list)
    complete_aborts: bool = True
    fail_trigger: BaseException | None = None
    fail_notify: BaseException | None = None
    triggers: list[TriggerCall] = field(default_factory=list)
    notified: list[int] = field(default_factory=list)
    aborts: list[tuple[int, Any]] = field(default_factory=list)
    abort_futures: dict[int, Future[None]] = field(default_factory=dict)
    on_trigger: Any = None  # optional callable(TriggerCall), e.g. to ack synchronously

    def participants(self) -> Sequence[ParticipantId]:
        return list(self.participant_ids)

    def not_ready(self) -> Sequence[ParticipantId]:
        return list(self.not_ready_ids)

    def trigger(self, checkpoint_id: int, timestamp_ms: int, location: Any,
                properties: CheckpointProperties) -> None:
        if self.fail_trigger is not None:
            raise self.fail_trigger
        call = TriggerCall(checkpoint_id, timestamp_ms, location, properties)
        self.triggers.append(call)
        if self.on_trigger is not None:
            self.on_trigger(call)

    def notify_complete(self, checkpoint_id: int, data: CompletedCheckpointData) -> None:
        self.notified.append(checkpoint_id)
        if self.fail_notify is not None:
            raise self.fail_notify

    def abort(self, checkpoint_id: int, reason: Any) -> Future[None]:
        self.aborts.append((checkpoint_id, reason))
        future: Future[None] = Future()
        self.abort_futures[checkpoint_id] = future
        if self.complete_aborts:
            future.set_result(None)
        return future

    @property
    def triggered_ids(self) -> list[int]:
        return [t.checkpoint_id for t in self.triggers]

    @property
    def aborted_ids(self) -> list[int]:
        return [cid for cid, _ in self.aborts]
