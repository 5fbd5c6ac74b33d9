"""Closing the REST server is idempotent: a job closes it when it ends, and whoever
tidies up after the job (a test harness, an embedding application) may close it again,
even while the first close is still shutting it down."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry

from sparkpoint.runtime.rest import RestServer


class _Listeners:
    def add_listener(self, fn) -> None:
        pass

    def register(self, fn):
        return lambda: None


class _Stats:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()


class _Coordinator:
    def __init__(self) -> None:
        self.stats = _Stats()
        self.alarms = _Listeners()


class _Job:
    run_id = "run-close"
    job_name = "close"

    def __init__(self) -> None:
        self.status = _Listeners()
        self.coordinator = _Coordinator()


def test_a_second_close_is_a_no_op_and_the_metrics_are_unregistered_once():
    server = RestServer(_Job(), "127.0.0.1", 0)
    server.close(linger_s=0)
    server.close(linger_s=0)   # raised KeyError: the collector was unregistered already
    server._thread.join(10)
    assert not server._thread.is_alive()


def test_closes_racing_each_other_both_return():
    server = RestServer(_Job(), "127.0.0.1", 0)
    errors: list[BaseException] = []

    def close() -> None:
        try:
            server.close(linger_s=0)
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    closers = [threading.Thread(target=close) for _ in range(4)]
    for t in closers:
        t.start()
    for t in closers:
        t.join(10)
    assert errors == []
