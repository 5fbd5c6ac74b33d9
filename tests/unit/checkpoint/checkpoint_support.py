"""A coordinator wired to in-memory collaborators and a manual clock."""

from __future__ import annotations

import random
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.checkpoint import (
    AckResult,
    CheckpointCoordinator,
    CheckpointCoordinatorConfig,
    CheckpointFailedError,
    CheckpointFailureEvent,
    CheckpointFailureReason,
    CompletedCheckpointData,
    ManualScheduler,
)
from tests.memory import InMemoryCheckpointStorage, InMemoryIdCounter, RecordingGateway

PARTICIPANTS = ["job", "source:numbers", "state:count/0"]


@dataclass
class Harness:
    scheduler: ManualScheduler
    ids: InMemoryIdCounter
    storage: InMemoryCheckpointStorage
    gateway: RecordingGateway
    coordinator: CheckpointCoordinator
    failed_jobs: list[tuple[CheckpointFailureReason, BaseException]] = field(default_factory=list)
    events: list[CheckpointFailureEvent] = field(default_factory=list)

    # -- driving --------------------------------------------------------------------
    def trigger(self, forced: bool = False, periodic: bool = False) -> Future[CompletedCheckpointData]:
        return self.coordinator.trigger_checkpoint(forced, periodic=periodic)

    def ack(self, checkpoint_id: int, participant: str, size: int = 0) -> AckResult:
        return self.coordinator.acknowledge(checkpoint_id, participant, handle_for(checkpoint_id, participant),
                                            {"bytes": size})

    def ack_all(self, checkpoint_id: int, except_: tuple[str, ...] = (), size: int = 0) -> list[AckResult]:
        return [self.ack(checkpoint_id, p, size) for p in self.gateway.participant_ids if p not in except_]

    def complete(self, future: Future[CompletedCheckpointData]) -> CompletedCheckpointData:
        """Ack the checkpoint behind a just-triggered future; return its data."""
        self.ack_all(self.gateway.triggered_ids[-1])
        return future.result(timeout=0)

    # -- observing ------------------------------------------------------------------
    def failures(self) -> dict[str, int]:
        return self.coordinator.stats.snapshot()["failures_by_reason"]

    def reasons_seen(self) -> set[CheckpointFailureReason]:
        return {CheckpointFailureReason[name] for name in self.failures()}


def handle_for(checkpoint_id: int, participant: str) -> dict[str, Any]:
    return {"participant": participant, "files": [f"chk-{checkpoint_id}/{participant.replace(':', '_')}"]}


def failure_reason(future: Future[Any]) -> CheckpointFailureReason:
    error = future.exception(timeout=0)
    assert isinstance(error, CheckpointFailedError), f"expected a failed checkpoint, got {error!r}"
    return error.reason


def make_harness(*, interval_ms: int = 1000, min_pause_ms: int = 0, timeout_ms: int = 10_000,
                 max_concurrent: int = 1, tolerable_failed: int = 3, num_retained: int = 2,
                 participants: list[str] | None = None, storage: InMemoryCheckpointStorage | None = None,
                 ids: InMemoryIdCounter | None = None, seed: int = 7,
                 fail_job: Any = None, gateway: RecordingGateway | None = None,
                 **coordinator_kwargs: Any) -> Harness:
    """`fail_job` replaces the recording callback; `gateway` a `RecordingGateway` (or a
    subclass that also acts, e.g. commits a sink); other keyword arguments go to the
    coordinator (e.g. `live_references`)."""
    config = CheckpointCoordinatorConfig(interval_ms=interval_ms, min_pause_ms=min_pause_ms,
                                         timeout_ms=timeout_ms, max_concurrent=max_concurrent,
                                         tolerable_failed=tolerable_failed, num_retained=num_retained)
    scheduler = ManualScheduler()
    ids = ids or InMemoryIdCounter()
    storage = storage or InMemoryCheckpointStorage()
    if gateway is None:
        gateway = RecordingGateway(participant_ids=list(participants if participants is not None else PARTICIPANTS))
    failed_jobs: list[tuple[CheckpointFailureReason, BaseException]] = []
    if fail_job is None:
        def fail_job(reason: CheckpointFailureReason, error: BaseException) -> None:
            failed_jobs.append((reason, error))
    coordinator = CheckpointCoordinator("orders", config, scheduler, ids, storage, gateway,
                                        rng=random.Random(seed), fail_job=fail_job, **coordinator_kwargs)
    harness = Harness(scheduler, ids, storage, gateway, coordinator, failed_jobs)
    coordinator.alarms.register(harness.events.append)
    return harness
