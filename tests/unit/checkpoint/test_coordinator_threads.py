"""The coordinator under real threads: a production scheduler and participants that
acknowledge from a thread pool. Guards against deadlocks and out-of-order completion."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from checkpoint_support import PARTICIPANTS, handle_for

from sparkpoint.checkpoint import CheckpointCoordinator, CheckpointCoordinatorConfig, ThreadScheduler
from sparkpoint.testing.memory import InMemoryCheckpointStorage, InMemoryIdCounter, RecordingGateway


def test_checkpoints_complete_in_id_order_with_acks_from_many_threads():
    scheduler = ThreadScheduler()
    pool = ThreadPoolExecutor(max_workers=4)
    storage = InMemoryCheckpointStorage()
    gateway = RecordingGateway(participant_ids=list(PARTICIPANTS))
    config = CheckpointCoordinatorConfig(interval_ms=2, timeout_ms=5000, max_concurrent=3, num_retained=2)
    failed_jobs: list = []
    coordinator = CheckpointCoordinator("orders", config, scheduler, InMemoryIdCounter(), storage, gateway,
                                        fail_job=lambda r, e: failed_jobs.append((r, e)))
    enough = threading.Event()

    def on_trigger(call) -> None:
        for participant in PARTICIPANTS:
            pool.submit(coordinator.acknowledge, call.checkpoint_id, participant,
                        handle_for(call.checkpoint_id, participant))

    def on_notify(checkpoint_id: int, data) -> None:
        gateway.notified.append(checkpoint_id)
        if len(gateway.notified) >= 20:
            enough.set()

    gateway.on_trigger = on_trigger
    gateway.notify_complete = on_notify
    try:
        coordinator.start_scheduler()
        assert enough.wait(10), "checkpoints stopped completing (deadlock?)"
    finally:
        coordinator.shutdown()
        scheduler.shutdown()
        pool.shutdown(wait=True)

    notified = list(gateway.notified)
    assert notified == sorted(notified) and len(set(notified)) == len(notified)
    assert failed_jobs == []
    assert all(cid in storage.metadata or any(d == cid for d, _ in storage.discarded_completed)
               for cid in notified)
    assert coordinator.failure_manager.consecutive_failures == 0
