"""KafkaSource without a broker: metrics on the registry the runtime exports."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, generate_latest

from sparkpoint.connectors import kafka_source
from sparkpoint.connectors.base import SourceContext
from sparkpoint.connectors.kafka_source import KafkaSource, OffsetCommitter
from sparkpoint.errors import KafkaConnectorError

FAILURES = "sparkpoint_kafka_offset_commit_failures_total"
COMMITS = "sparkpoint_kafka_offset_commits_total"


class UnreachableGroup:
    """GroupOffsetWriter while the group coordinator does not answer."""

    def __init__(self, _config, _timeout_s):
        pass

    def __call__(self, _offsets):
        raise KafkaConnectorError("offset commit not acknowledged within 0s")

    def close(self):
        pass


def test_offset_commit_counters_are_exported_on_the_bound_registry(monkeypatch):
    """Defect 14: the counters lived on prometheus_client's global registry, while the
    job's exporter serves only the coordinator's: the documented failure counter was
    never exported."""
    monkeypatch.setattr(kafka_source, "GroupOffsetWriter", UnreachableGroup)
    registry = CollectorRegistry()
    source = KafkaSource("127.0.0.1:1", "t", group_id="g-bound", reader="confluent",
                         commit_backoff_ms=1, commit_backoff_max_ms=5, commit_timeout_ms=100)
    source.bind_metrics(registry)
    source.open(SourceContext(spark=None, job_name="job"))
    try:
        source.notify_checkpoint_complete(1, {"t:0": 5})
        deadline = threading.Event()
        for _ in range(100):
            if (registry.get_sample_value(FAILURES, {"group": "g-bound"}) or 0) >= 1:
                break
            deadline.wait(0.05)
    finally:
        source.close()

    exported = generate_latest(registry).decode()
    assert f'{FAILURES}{{group="g-bound"}}' in exported
    assert registry.get_sample_value(FAILURES, {"group": "g-bound"}) >= 1


def test_binding_after_open_and_twice_on_one_registry():
    registry = CollectorRegistry()
    calls: list[dict] = []
    committer = OffsetCommitter("g-late", calls.append)
    committer.bind_metrics(registry)
    other = OffsetCommitter("g-other", calls.append)
    other.bind_metrics(registry)                 # one registry, two sources: no duplicate error

    committer.submit(1, {"t:0": 1})
    assert committer.wait_idle(5)
    committer.close()
    other.close()

    assert registry.get_sample_value(COMMITS, {"group": "g-late"}) == 1
    assert "sparkpoint_kafka_offset_commit_failures" in generate_latest(registry).decode()


def test_bind_metrics_before_and_after_open_reach_the_committer(monkeypatch):
    monkeypatch.setattr(kafka_source, "GroupOffsetWriter", UnreachableGroup)
    first, second = CollectorRegistry(), CollectorRegistry()
    source = KafkaSource("127.0.0.1:1", "t", group_id="g-rebind", reader="confluent")
    source.bind_metrics(first)
    source.open(SourceContext(spark=None, job_name="job"))
    try:
        assert source.committer.metrics.registry is first
        source.bind_metrics(second)
        assert source.committer.metrics.registry is second
    finally:
        source.close()
