"""Offset commits after checkpoint completion (seed 003): retried with backoff in the
background, newest wins, never raise into the job, one log line per interval."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from prometheus_client import REGISTRY

from kafka_support import FAST_RECONNECT, KafkaTestClient
from sparkpoint.connectors.base import SourceContext
from sparkpoint.connectors.kafka_common import RateLimitedLog
from sparkpoint.connectors.kafka_source import KafkaSource, OffsetCommitter
from tests.servers.names import unique_name

pytestmark = pytest.mark.kafka


def failures_metric(group: str) -> float:
    return REGISTRY.get_sample_value("sparkpoint_kafka_offset_commit_failures_total",
                                     {"group": group}) or 0.0


class FlakyGroup:
    """A consumer group whose coordinator is unavailable until `recover()`."""

    def __init__(self, fail_after_calls: int = 2):
        self.calls: list[dict[str, int]] = []
        self.available = threading.Event()
        self.failed_enough = threading.Event()
        self._fail_after = fail_after_calls

    def commit(self, offsets):
        self.calls.append(dict(offsets))
        if len(self.calls) >= self._fail_after:
            self.failed_enough.set()
        if not self.available.is_set():
            raise RuntimeError("CoordinatorNotAvailableException: The coordinator is not available")


def test_newer_checkpoint_supersedes_a_failing_commit():
    group = FlakyGroup()
    committer = OffsetCommitter("g-flaky", group.commit, backoff_ms=1, backoff_max_ms=5)
    committer.submit(1, {"t:0": 10})
    assert group.failed_enough.wait(10)

    committer.submit(2, {"t:0": 20})
    group.available.set()

    assert committer.wait_idle(10)
    assert committer.committed.checkpoint_id == 2
    first_success = next(i for i, c in enumerate(group.calls) if c == {"t:0": 20})
    assert {"t:0": 10} not in group.calls[first_success:]   # never goes backwards
    assert failures_metric("g-flaky") >= 2
    committer.close()


def test_older_checkpoint_is_never_committed_after_a_newer_one():
    group = FlakyGroup()
    group.available.set()
    committer = OffsetCommitter("g-order", group.commit)
    committer.submit(5, {"t:0": 50})
    assert committer.wait_idle(10)

    committer.submit(4, {"t:0": 40})

    assert committer.wait_idle(10)
    assert group.calls == [{"t:0": 50}]
    committer.close()


def test_close_stops_retrying_without_raising():
    group = FlakyGroup()
    committer = OffsetCommitter("g-close", group.commit, backoff_ms=1, backoff_max_ms=5)
    committer.submit(1, {"t:0": 1})
    assert group.failed_enough.wait(10)

    committer.close(timeout_s=5)
    calls = len(group.calls)

    assert not committer.wait_idle(0)
    assert committer._thread is not None and not committer._thread.is_alive()
    assert len(group.calls) == calls


def test_rate_limited_log_writes_one_line_per_interval(caplog):
    now = [0.0]
    logger = logging.getLogger("test.ratelimit")
    limited = RateLimitedLog(logger, interval_s=60, clock=lambda: now[0])

    with caplog.at_level(logging.WARNING, logger="test.ratelimit"):
        written = [limited.warning("commit failed") for _ in range(100)]
        now[0] = 61.0
        limited.warning("commit failed")

    assert written.count(True) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "commit failed", "commit failed (99 similar messages suppressed)"]


def test_commit_due_while_broker_is_down_succeeds_after_restart(kafka_broker_to_restart, caplog):
    broker = kafka_broker_to_restart
    topic, group = unique_name("outage"), unique_name("g-outage")
    client = KafkaTestClient(broker.bootstrap_servers)
    client.create_topic(topic, 1)
    client.produce(topic, [(0, None, b"a"), (0, None, b"b")])
    client.close()
    source = KafkaSource(broker.bootstrap_servers, topic, group_id=group,
                         client_config=FAST_RECONNECT, commit_backoff_ms=50,
                         commit_backoff_max_ms=500, commit_timeout_ms=1000)
    source.open(SourceContext(spark=None, job_name="outage"))
    end = source.plan(source.initial_positions()).end
    before = failures_metric(group)

    broker.stop()
    with caplog.at_level(logging.WARNING, logger="sparkpoint.connectors.kafka_source"):
        source.notify_checkpoint_complete(1, end)       # must not raise
        deadline = time.monotonic() + 30
        while source.committer.failed_attempts < 2:
            assert time.monotonic() < deadline, "commit was not retried"
            time.sleep(0.05)
        assert not source.committer.wait_idle(0)

        broker.start()
        assert source.committer.wait_idle(60)

    after_restart = KafkaTestClient(broker.bootstrap_servers)   # same port as before
    assert after_restart.committed_offsets(group, topic, 1) == {0: 2}
    assert [v for *_, v in after_restart.read_committed(topic)] == [b"a", b"b"]  # data kept
    assert failures_metric(group) - before == source.committer.failed_attempts
    commit_warnings = [r for r in caplog.records if "committing offsets" in r.getMessage()]
    assert len(commit_warnings) == 1   # one line per minute, not one per retry
    source.close()
    after_restart.close()
