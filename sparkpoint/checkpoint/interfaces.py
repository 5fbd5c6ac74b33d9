"""The coordinator's collaborators, as protocols.

`checkpoint/` knows nothing of Spark or of any filesystem: the runtime plugs in
participants (the things that snapshot), `storage/` plugs in a `CheckpointStorage`
and a durable `CheckpointIDCounter`, and tests plug in in-memory versions of all
three plus a manually advanced scheduler.

Everything that crosses these interfaces and is later written to checkpoint
storage is plain JSON-compatible data (dicts, lists, str, int, float, bool, None):
nothing is ever pickled.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

# A participant is anything that must snapshot for a checkpoint to complete:
# "job" (epoch/watermark), "source:<name>", "state:<op>/<subtask>", "sink:<name>".
ParticipantId = str

# What a participant hands back when its snapshot is durable: JSON-compatible.
StateHandle = Mapping[str, Any]


@dataclass(frozen=True)
class CheckpointProperties:
    """How a checkpoint was asked for. Forced (manual) checkpoints skip the
    min-pause and max-concurrent pre-checks, like Flink's forced checkpoints."""

    forced: bool = False
    periodic: bool = True
    # A savepoint (Flink's semantics): asked for by a person, written self-contained to
    # `target` (None: the storage's default place), never subsumed by a later checkpoint.
    savepoint: bool = False
    target: str | None = None
    # The savepoint of a stop-with-savepoint: the job ends with it. Only such a savepoint
    # commits side effects (Flink's rule since 1.15). An intermediate savepoint is not
    # what a failover restores, so output it committed would be replayed and published
    # again; what it staged is committed by the next checkpoint instead.
    terminate: bool = False

    @property
    def commits_side_effects(self) -> bool:
        """Whether completing it notifies participants to commit (sinks publish, sources
        commit offsets): every checkpoint, and a savepoint only if the job ends with it."""
        return not self.savepoint or self.terminate


@dataclass(frozen=True)
class CompletedCheckpointData:
    """Everything `_metadata` records for one completed checkpoint."""

    job_name: str
    checkpoint_id: int
    trigger_timestamp_ms: int
    completion_timestamp_ms: int
    handles: Mapping[ParticipantId, StateHandle]
    properties: CheckpointProperties = field(default_factory=CheckpointProperties)


class CheckpointIDCounter(Protocol):
    """Hands out checkpoint ids. The durable implementation (storage/) persists the
    highest id ever handed out, so ids are never reused across restarts (seed 002)."""

    def start(self) -> None: ...

    def get_and_increment(self) -> int:
        """Return the next unused id and persist that it is used.
        Raises StorageError if the counter cannot be persisted."""
        ...

    def get(self) -> int:
        """The id the next `get_and_increment` would return."""
        ...

    def set_count(self, next_id: int) -> None:
        """Move the counter forward (never backward) so the next id is >= next_id."""
        ...

    def shutdown(self) -> None: ...


class CheckpointLocation(Protocol):
    checkpoint_id: int

    @property
    def path(self) -> str:
        """Where this checkpoint's exclusive files live (`.../chk-<id>`)."""
        ...


class CheckpointStorage(Protocol):
    """The coordinator's view of checkpoint storage.

    Errors: every method raises `sparkpoint.errors.StorageError` (or a subclass) on
    I/O failure; the coordinator turns that into a typed checkpoint failure.
    """

    def initialize_location(self, checkpoint_id: int) -> CheckpointLocation:
        """Create `chk-<id>/`. Raises `CheckpointIdCollision` if that directory (or
        its `_metadata`) already exists: left by a crashed run or another writer.
        The coordinator then skips to a fresh id instead of failing."""
        ...

    def commit_metadata(self, location: CheckpointLocation, data: CompletedCheckpointData) -> None:
        """Write `chk-<id>/_metadata` with an exclusive create, last of all files.
        Raises `MetadataExistsError` if it exists, `LeaseLostError` if this run no
        longer holds the job's lease (fencing), `StorageError` on I/O failure."""
        ...

    def discard_location(self, checkpoint_id: int) -> None:
        """Delete the files of a checkpoint that will never complete. Called only once
        every writer of that checkpoint has stopped. Idempotent."""
        ...

    def discard_completed(self, checkpoint_id: int, still_referenced: Sequence[StateHandle]) -> None:
        """Delete a subsumed completed checkpoint's exclusive files and any shared files
        no longer referenced by `still_referenced` (the retained checkpoints' handles, the
        handles of checkpoints in flight, and the runtime's live references)."""
        ...

    def load_completed(self) -> list[CompletedCheckpointData]:
        """All completed checkpoints of this job, oldest first, whose metadata parses and
        verifies. Directories without `_metadata` are never returned."""
        ...


@runtime_checkable
class SupportsHighestCheckpointId(Protocol):
    """Optional extra of a `CheckpointStorage`: the highest id of any `chk-<id>/`
    directory, completed or not. The coordinator uses it to move the id counter past
    leftovers of crashed runs at restore and after an id collision, instead of
    probing one id at a time."""

    def highest_checkpoint_id(self) -> int | None:
        """None if there is no checkpoint directory. Raises StorageError on I/O failure."""
        ...


@runtime_checkable
class SupportsDiscardAborted(Protocol):
    """Optional extra of a `CheckpointStorage`: delete an aborted checkpoint together with
    the shared files its snapshots uploaded, instead of leaving those to the start-up GC.

    The coordinator calls it, instead of `discard_location`, for an aborted checkpoint that
    received at least one state handle, and only once `gateway.abort(id)`'s future
    completed successfully (no writer of that checkpoint can still write). Never after
    this run lost its lease."""

    def discard_aborted(self, checkpoint_id: int, handles: Sequence[StateHandle],
                        still_referenced: Sequence[StateHandle]) -> None:
        """Do what `discard_location(checkpoint_id)` does (delete `chk-<id>/`), and delete
        every shared file that a handle in `handles` references and no handle in
        `still_referenced` references.

        - `handles`: what the aborted checkpoint's participants acknowledged (also acks
          that arrived after the abort).
        - `still_referenced`: handles of the retained completed checkpoints, of every other
          checkpoint in flight (pending or finalizing), and the runtime's live references.
          A file any of them names must survive.
        - Never delete a file outside this job's checkpoint directory, nor anything under
          another `chk-<other id>/`.
        - Idempotent (a file already gone is fine); a failure may leave some files behind
          (GC removes them later). Raises `StorageError` on I/O failure, `LeaseLostError`
          if this run was fenced out (then delete nothing)."""
        ...


@runtime_checkable
class SupportsSavepointComplete(Protocol):
    """Optional extra of a `ParticipantGateway`: told that an intermediate savepoint is
    durable, so the runtime can let go of what it holds for that savepoint's snapshot.
    Nothing is committed: the next completed checkpoint commits what it staged."""

    def savepoint_complete(self, checkpoint_id: int, data: CompletedCheckpointData) -> None:
        """Must not raise for the coordinator's sake."""
        ...


class ParticipantGateway(Protocol):
    """How the coordinator talks to the participants; the runtime implements it.

    All calls are fire-and-forget from the coordinator's point of view: results come
    back as `acknowledge`/`decline` calls on the coordinator, from any thread."""

    def participants(self) -> Sequence[ParticipantId]:
        """The participants that must ack every checkpoint."""
        ...

    def not_ready(self) -> Sequence[ParticipantId]:
        """Participants that are not running yet (scheduled, restoring). A checkpoint is
        not triggered while any exist (pre-check NOT_ALL_REQUIRED_TASKS_RUNNING)."""
        ...

    def trigger(self, checkpoint_id: int, timestamp_ms: int, location: CheckpointLocation,
                properties: CheckpointProperties) -> None:
        """Ask for a barrier: the runtime injects it at the next epoch boundary."""
        ...

    def notify_complete(self, checkpoint_id: int, data: CompletedCheckpointData) -> None:
        """The checkpoint is durable: sources commit offsets, sinks commit. Must not raise
        for the coordinator's sake; failures here never fail the checkpoint. Never called
        for an intermediate savepoint (see `CheckpointProperties.commits_side_effects`)."""
        ...

    def abort(self, checkpoint_id: int, reason: Any) -> "Future[None]":
        """Cancel the checkpoint's in-flight snapshot work. The returned future completes
        once no writer of this checkpoint can still write; only then are its files deleted
        (seed 000)."""
        ...


class Scheduler(Protocol):
    """Timers, injected so tests drive time by hand."""

    def now_ms(self) -> int: ...

    def schedule(self, delay_ms: int, fn: Callable[[], None]) -> "Cancellable": ...

    def schedule_at_fixed_rate(self, initial_delay_ms: int, period_ms: int,
                               fn: Callable[[], None]) -> "Cancellable": ...


class Cancellable(Protocol):
    def cancel(self) -> None: ...
