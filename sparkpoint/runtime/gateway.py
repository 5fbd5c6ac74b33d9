"""The runtime side of checkpoints: barriers, the asynchronous part, and the
participants' reactions to complete / abort.

Threads: the coordinator calls `trigger`/`abort`/`notify_complete` from its timer
thread or from whichever thread delivered the last ack; the epoch loop calls
`take_barriers` and `start_async_part` from the main thread; uploads run on a
small pool. Sink and source commits run on one committer thread, in checkpoint
order, so a slow broker never blocks the coordinator or the epoch loop.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from sparkpoint.checkpoint.interfaces import CheckpointLocation, CheckpointProperties, CompletedCheckpointData
from sparkpoint.runtime.failures import summarize

log = logging.getLogger(__name__)


@dataclass
class Barrier:
    checkpoint_id: int
    timestamp_ms: int
    location: CheckpointLocation
    properties: CheckpointProperties


@dataclass
class _InFlight:
    cancel: threading.Event = field(default_factory=threading.Event)
    futures: list[Future] = field(default_factory=list)


def _all_done(futures: Sequence[Future]) -> Future:
    """A future that completes when every one of `futures` has (in any way)."""
    done: Future = Future()
    remaining = [len(futures)]
    lock = threading.Lock()
    if not futures:
        done.set_result(None)
        return done

    def one(_f: Future) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            done.set_result(None)

    for f in futures:
        f.add_done_callback(one)
    return done


class RuntimeGateway:
    """Implements `checkpoint.interfaces.ParticipantGateway` for the epoch runtime."""

    def __init__(self, participants: Sequence[str], on_complete: Callable[[int, CompletedCheckpointData], None],
                 upload_workers: int = 2,
                 on_commit_outcome: Callable[[int, BaseException | None], None] | None = None):
        self._participants = list(participants)
        self._on_complete = on_complete
        # Told of every commit's outcome (the error, or None) after it ended.
        self._on_commit_outcome = on_commit_outcome
        self._lock = threading.Lock()
        self._barriers: list[Barrier] = []
        self._inflight: dict[int, _InFlight] = {}
        self._restoring: set[str] = set()
        self._pool = ThreadPoolExecutor(upload_workers, thread_name_prefix="checkpoint-async")
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-commit")
        # The newest completed checkpoint whose commit failed and no later commit made up for.
        self._failed_commit: tuple[int, CompletedCheckpointData, BaseException] | None = None

    # -- ParticipantGateway --------------------------------------------------------
    def participants(self) -> Sequence[str]:
        return list(self._participants)

    def not_ready(self) -> Sequence[str]:
        with self._lock:
            return sorted(self._restoring)

    def trigger(self, checkpoint_id: int, timestamp_ms: int, location: CheckpointLocation,
                properties: CheckpointProperties) -> None:
        with self._lock:
            self._barriers.append(Barrier(checkpoint_id, timestamp_ms, location, properties))
            self._inflight.setdefault(checkpoint_id, _InFlight())

    def notify_complete(self, checkpoint_id: int, data: CompletedCheckpointData) -> None:
        with self._lock:
            self._inflight.pop(checkpoint_id, None)
        self._committer.submit(self._run_complete, checkpoint_id, data)

    def savepoint_complete(self, checkpoint_id: int, data: CompletedCheckpointData) -> None:
        """An intermediate savepoint is durable: forget its in-flight part. Nothing is
        committed; the next checkpoint's handles cover what it staged."""
        with self._lock:
            self._inflight.pop(checkpoint_id, None)

    def abort(self, checkpoint_id: int, reason: Any) -> Future:
        with self._lock:
            self._barriers = [b for b in self._barriers if b.checkpoint_id != checkpoint_id]
            inflight = self._inflight.pop(checkpoint_id, None)
        if inflight is None:
            return _all_done([])
        inflight.cancel.set()
        return _all_done(list(inflight.futures))

    # -- used by the epoch loop ----------------------------------------------------
    def set_restoring(self, participants: Sequence[str]) -> None:
        with self._lock:
            self._restoring = set(participants)

    def mark_ready(self, participant: str) -> None:
        with self._lock:
            self._restoring.discard(participant)

    def take_barriers(self, which: Callable[[Barrier], bool] | None = None) -> list[Barrier]:
        """The barriers injected since the last call (only those `which` accepts; the
        others stay for the next call)."""
        with self._lock:
            if which is None:
                barriers, self._barriers = self._barriers, []
            else:
                barriers = [b for b in self._barriers if which(b)]
                self._barriers = [b for b in self._barriers if not which(b)]
            return barriers

    def has_barrier(self) -> bool:
        with self._lock:
            return bool(self._barriers)

    def cancel_event(self, checkpoint_id: int) -> threading.Event | None:
        with self._lock:
            inflight = self._inflight.get(checkpoint_id)
            return inflight.cancel if inflight else None

    def start_async_part(self, checkpoint_id: int, fn: Callable[[threading.Event], Any],
                         on_done: Callable[[Future], None]) -> bool:
        """Run `fn(cancel_event)` in the background for `checkpoint_id`. Returns False if
        the checkpoint was aborted already (nothing is started then)."""
        with self._lock:
            inflight = self._inflight.get(checkpoint_id)
            if inflight is None or inflight.cancel.is_set():
                return False
            fut = self._pool.submit(fn, inflight.cancel)
            inflight.futures.append(fut)
        fut.add_done_callback(on_done)
        return True

    def wait_idle(self, timeout_s: float = 60) -> None:
        """Block until no asynchronous part is running (before local state is wiped)."""
        with self._lock:
            futures = [f for i in self._inflight.values() for f in i.futures]
        _all_done(futures).result(timeout=timeout_s)

    def abort_all_local(self) -> None:
        """Failover: cancel every in-flight asynchronous part (the coordinator also aborts
        its pending checkpoints when the job leaves RUNNING)."""
        with self._lock:
            self._barriers.clear()
            for inflight in self._inflight.values():
                inflight.cancel.set()

    def drain_commits(self, timeout_s: float = 60) -> None:
        self._committer.submit(lambda: None).result(timeout=timeout_s)

    def failed_commit(self) -> tuple[int, CompletedCheckpointData, BaseException] | None:
        """(id, data, error) of the newest completed checkpoint whose commit failed, unless a
        later commit succeeded (handles are cumulative, so it published that output too)."""
        with self._lock:
            return self._failed_commit

    def commit_again(self, checkpoint_id: int, data: CompletedCheckpointData) -> None:
        """Re-run a failed commit on the calling thread (the committer must be idle: drained).
        Raises what the commit raises."""
        self._on_complete(checkpoint_id, data)
        self._commit_done(checkpoint_id, data, None)
        self._tell_outcome(checkpoint_id, None)

    def _commit_done(self, checkpoint_id: int, data: CompletedCheckpointData, error: BaseException | None) -> None:
        with self._lock:
            failed = self._failed_commit
            if error is not None:
                if failed is None or failed[0] <= checkpoint_id:
                    self._failed_commit = (checkpoint_id, data, error)
            elif failed is not None and failed[0] <= checkpoint_id:
                self._failed_commit = None

    def shutdown(self) -> None:
        self.abort_all_local()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._committer.shutdown(wait=True)

    # -----------------------------------------------------------------------------
    def _run_complete(self, checkpoint_id: int, data: CompletedCheckpointData) -> None:
        try:
            self._on_complete(checkpoint_id, data)
        except Exception as e:
            # The checkpoint is durable; a commit that failed here is re-run by the next
            # completion (handles are cumulative) or by recovery after a restart. After the
            # final checkpoint there is no next one: the job retries it (`failed_commit`).
            log.warning("post-completion commit for checkpoint %d failed: %s; it is retried by the next "
                        "checkpoint or on restore", checkpoint_id, summarize(e), exc_info=log.isEnabledFor(logging.DEBUG))
            self._commit_done(checkpoint_id, data, e)
            self._tell_outcome(checkpoint_id, e)
        else:
            self._commit_done(checkpoint_id, data, None)
            self._tell_outcome(checkpoint_id, None)

    def _tell_outcome(self, checkpoint_id: int, error: BaseException | None) -> None:
        if self._on_commit_outcome is None:
            return
        try:
            self._on_commit_outcome(checkpoint_id, error)
        except Exception:  # a listener's bug must not stop the commits after this one
            log.exception("the listener of checkpoint %d's commit failed", checkpoint_id)
