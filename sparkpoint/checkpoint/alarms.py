"""Checkpoint failure alarms: one event per failed checkpoint, to whoever listens.

Which failures raise an event: every failure of a checkpoint that got an id (it was
started, or its id collided), and every counted failure. Refusals before an id is
assigned that only mean "not now" (too many concurrent, min pause, already queued,
scheduler stopped, participants not running yet) are logged at DEBUG/INFO and
counted in metrics, but raise no event: they happen by design on every busy or
starting job, and an alarm nobody needs to act on teaches people to ignore alarms.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import urllib.request
from dataclasses import asdict, dataclass
from typing import Callable

from sparkpoint.checkpoint.interfaces import ParticipantId
from sparkpoint.checkpoint.reasons import CheckpointFailureReason

log = logging.getLogger(__name__)

_MAX_ERROR_SUMMARY = 500


@dataclass(frozen=True)
class CheckpointFailureEvent:
    checkpoint_id: int | None
    reason: CheckpointFailureReason
    participant: ParticipantId | None
    error_summary: str | None
    consecutive_failures: int
    threshold: int
    counted: bool
    timestamp_ms: int
    job_name: str = ""

    def to_json_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["reason"] = self.reason.name
        data["message"] = self.reason.message
        data["action"] = self.reason.action
        return data


AlarmListener = Callable[[CheckpointFailureEvent], None]


def summarize_error(error: BaseException | None) -> str | None:
    if error is None:
        return None
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= _MAX_ERROR_SUMMARY else text[: _MAX_ERROR_SUMMARY - 3] + "..."


class AlarmBus:
    """Delivers events to listeners in registration order, in the caller's thread.
    A listener that raises is logged and skipped; it never breaks the coordinator."""

    def __init__(self) -> None:
        self._listeners: list[AlarmListener] = []
        self._lock = threading.Lock()

    def register(self, listener: AlarmListener) -> Callable[[], None]:
        """Returns a function that unregisters the listener."""
        with self._lock:
            self._listeners.append(listener)

        def unregister() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unregister

    def emit(self, event: CheckpointFailureEvent) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                log.exception("checkpoint alarm listener %r failed on %s for checkpoint %s; "
                              "the coordinator continues without it",
                              listener, event.reason.name, event.checkpoint_id)


class WebhookAlarmListener:
    """POSTs each event as JSON to `url`, best effort, from one background thread.

    The coordinator never waits for the webhook: events are queued (at most
    `max_queued`; beyond that new events are dropped with a warning) and a failed
    POST is logged and not retried."""

    def __init__(self, url: str, timeout_s: float = 5.0, max_queued: int = 100) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"alarm webhook url must start with http:// or https://, got {url!r}")
        self.url = url
        self.timeout_s = timeout_s
        self._queue: queue.Queue[CheckpointFailureEvent | None] = queue.Queue(max_queued)
        self._thread = threading.Thread(target=self._run, name="sparkpoint-alarm-webhook",
                                        daemon=True)
        self._thread.start()

    def __call__(self, event: CheckpointFailureEvent) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.warning("alarm webhook %s is not keeping up; dropped the event for checkpoint %s (%s)",
                        self.url, event.checkpoint_id, event.reason.name)

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued (within `timeout_s`), then stop the thread."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            self._post(event)

    def _post(self, event: CheckpointFailureEvent) -> None:
        body = json.dumps(event.to_json_dict()).encode()
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
        except Exception as e:
            log.warning("could not POST checkpoint alarm for checkpoint %s to %s: %s; "
                        "check the webhook url and that the receiver is up",
                        event.checkpoint_id, self.url, e)
