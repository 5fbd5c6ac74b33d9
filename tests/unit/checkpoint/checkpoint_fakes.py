"""Fakes for coordinator tests that need more than tests/memory.py offers:
storage calls that block until released (stalls), arbitrary exceptions, the optional
`discard_aborted` extra of a CheckpointStorage, and savepoint locations."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from sparkpoint.checkpoint import CompletedCheckpointData, StateHandle
from tests.memory import InMemoryCheckpointStorage, InMemoryIdCounter

WAIT_S = 5.0  # generous bound for "this must happen"; never slept unless something is broken


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Poll until another thread got somewhere observable (no fixed sleeps)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.002)


class Gate:
    """A point where a call stops until the test opens it. `entered` is set once a call
    arrived and waits; `open()` lets it (and every later call) through."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._open = threading.Event()

    def wait_here(self) -> None:
        self.entered.set()
        if not self._open.wait(WAIT_S * 4):
            raise AssertionError("gate never opened: the test forgot to release a stalled call")

    def open(self) -> None:
        self._open.set()


class StallingStorage(InMemoryCheckpointStorage):
    """`stall(op)` makes the next call of `op` wait at the returned gate until it opens;
    `raise_on(op, error)` makes every call of `op` raise `error` (any exception type)
    until `raise_on(op, None)`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gates: dict[str, Gate] = {}
        self._raises: dict[str, BaseException] = {}

    def stall(self, op: str) -> Gate:
        gate = Gate()
        self._gates[op] = gate
        return gate

    def raise_on(self, op: str, error: BaseException | None) -> None:
        """None: stop raising."""
        if error is None:
            self._raises.pop(op, None)
        else:
            self._raises[op] = error

    def _before(self, op: str) -> None:
        gate = self._gates.pop(op, None)
        if gate is not None:
            gate.wait_here()
        if op in self._raises:
            raise self._raises[op]

    def initialize_location(self, checkpoint_id: int) -> Any:
        self._before("initialize_location")
        return super().initialize_location(checkpoint_id)

    def commit_metadata(self, location: Any, data: CompletedCheckpointData) -> None:
        self._before("commit_metadata")
        super().commit_metadata(location, data)

    def discard_location(self, checkpoint_id: int) -> None:
        self._before("discard_location")
        super().discard_location(checkpoint_id)


class DiscardingStorage(StallingStorage):
    """Implements the optional `SupportsDiscardAborted` extra and records its calls as
    (checkpoint_id, handles, still_referenced)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.discarded_aborted: list[tuple[int, list[StateHandle], list[StateHandle]]] = []

    def discard_aborted(self, checkpoint_id: int, handles: Sequence[StateHandle],
                        still_referenced: Sequence[StateHandle]) -> None:
        self._before("discard_aborted")
        self.events.append(("discard_aborted", checkpoint_id))
        self.directories.discard(checkpoint_id)
        self.discarded_aborted.append((checkpoint_id, list(handles), list(still_referenced)))


class RaisingIdCounter(InMemoryIdCounter):
    """An id counter whose next `get_and_increment` raises `error` (any type), or stalls
    at a gate."""

    def __init__(self) -> None:
        super().__init__()
        self.error: BaseException | None = None
        self.gate: Gate | None = None

    def get_and_increment(self) -> int:
        gate, self.gate = self.gate, None
        if gate is not None:
            gate.wait_here()
        error, self.error = self.error, None
        if error is not None:
            raise error
        return super().get_and_increment()


@dataclass(frozen=True)
class InMemorySavepointLocation:
    checkpoint_id: int
    target: str

    @property
    def path(self) -> str:
        return self.target


class SavepointStorage(StallingStorage):
    """Also writes savepoints, as the real storage does: `initialize_savepoint_location`
    gives a place outside `chk-*`, and a savepoint's `_metadata` lands in `savepoints`
    (by target), never in `metadata`, so `load_completed` (the job's `chk-*`) never
    returns it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.savepoints: dict[str, CompletedCheckpointData] = {}

    def initialize_savepoint_location(self, checkpoint_id: int, target: str | None) -> InMemorySavepointLocation:
        self._before("initialize_savepoint_location")
        self.events.append(("initialize_savepoint_location", checkpoint_id))
        default = f"mem://job/savepoints/savepoint-{checkpoint_id}"
        return InMemorySavepointLocation(checkpoint_id, target or default)

    def commit_metadata(self, location: Any, data: CompletedCheckpointData) -> None:
        if not isinstance(location, InMemorySavepointLocation):
            super().commit_metadata(location, data)
            return
        self._before("commit_metadata")
        self.events.append(("commit_savepoint_metadata", data.checkpoint_id))
        self.savepoints[location.target] = data
