from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from sparkpoint.checkpoint import AlarmBus, CheckpointFailureEvent, CheckpointFailureReason as R, WebhookAlarmListener


def event(checkpoint_id: int = 3) -> CheckpointFailureEvent:
    return CheckpointFailureEvent(checkpoint_id=checkpoint_id, reason=R.TASK_ASYNC_FAILURE,
                                  participant="state:count/0", error_summary="OSError: disk",
                                  consecutive_failures=2, threshold=10, counted=True,
                                  timestamp_ms=1234, job_name="orders")


def test_bus_delivers_in_order_and_survives_a_raising_listener(caplog):
    bus = AlarmBus()
    seen: list[tuple[str, int | None]] = []
    bus.register(lambda e: seen.append(("first", e.checkpoint_id)))
    bus.register(lambda e: 1 / 0)
    unregister = bus.register(lambda e: seen.append(("last", e.checkpoint_id)))
    with caplog.at_level(logging.ERROR):
        bus.emit(event(1))
    assert seen == [("first", 1), ("last", 1)]
    assert "ZeroDivisionError" in caplog.text
    unregister()
    bus.emit(event(2))
    assert seen[-1] == ("first", 2)


@pytest.fixture
def receiver():
    bodies: list[dict] = []
    got = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()
            got.set()

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/alarm", bodies, got
    server.shutdown()
    server.server_close()


def test_webhook_posts_the_event_as_json(receiver):
    url, bodies, got = receiver
    listener = WebhookAlarmListener(url, timeout_s=5)
    listener(event())
    assert got.wait(5)
    listener.close()
    [body] = bodies
    assert body["checkpoint_id"] == 3 and body["reason"] == "TASK_ASYNC_FAILURE"
    assert body["participant"] == "state:count/0" and body["counted"] is True
    assert body["action"] == R.TASK_ASYNC_FAILURE.action


def test_webhook_failure_is_logged_and_never_raises(caplog):
    # A port nothing listens on: bind one, then close it.
    server = HTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_port
    server.server_close()
    listener = WebhookAlarmListener(f"http://127.0.0.1:{port}/", timeout_s=2)
    with caplog.at_level(logging.WARNING):
        listener(event())
        listener.close()
    assert "could not POST checkpoint alarm for checkpoint 3" in caplog.text


def test_webhook_rejects_a_url_that_is_not_http():
    with pytest.raises(ValueError, match="http"):
        WebhookAlarmListener("ftp://example")
