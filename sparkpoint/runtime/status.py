"""Job status, with Flink's names, and the listeners that react to it (the
checkpoint scheduler runs only while RUNNING, as in Flink's CheckpointCoordinatorDeActivator)."""

from __future__ import annotations

import enum
import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class JobStatus(str, enum.Enum):
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    RESTARTING = "RESTARTING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED)


JobStatusListener = Callable[[JobStatus, JobStatus, "BaseException | None"], None]

_ALLOWED = {
    JobStatus.CREATED: {JobStatus.RUNNING, JobStatus.FAILING, JobStatus.FAILED, JobStatus.CANCELED},
    JobStatus.RUNNING: {JobStatus.FAILING, JobStatus.FINISHED, JobStatus.CANCELED, JobStatus.FAILED},
    JobStatus.FAILING: {JobStatus.RESTARTING, JobStatus.FAILED, JobStatus.CANCELED},
    JobStatus.RESTARTING: {JobStatus.RUNNING, JobStatus.FAILING, JobStatus.FAILED, JobStatus.CANCELED},
}


class JobStatusTracker:
    def __init__(self) -> None:
        self._status = JobStatus.CREATED
        self._since = time.time()
        self._listeners: list[JobStatusListener] = []
        self._lock = threading.Lock()
        self.history: list[JobStatus] = [JobStatus.CREATED]

    @property
    def status(self) -> JobStatus:
        return self._status

    def add_listener(self, listener: JobStatusListener) -> None:
        self._listeners.append(listener)

    def transition(self, new: JobStatus, error: BaseException | None = None) -> None:
        with self._lock:
            old = self._status
            if new == old:
                return
            if new not in _ALLOWED.get(old, set()):
                raise RuntimeError(f"illegal job status transition {old.value} -> {new.value}")
            self._status = new
            self._since = time.time()
            self.history.append(new)
        log.info("job status %s -> %s%s", old.value, new.value, f" ({error})" if error else "")
        for listener in list(self._listeners):
            try:
                listener(old, new, error)
            except Exception:  # a listener must never break the state machine
                log.exception("job status listener failed")
