"""Kafka -> PySpark -> Kafka through the runtime, with a failover in the middle:
every input record appears in the output topic exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_support import FAST_RECONNECT, BoundedKafkaSource, KafkaTestClient
from sparkpoint.connectors.kafka_sink import KafkaSink

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


class FailOnce:
    """A stateless step that fails the job's `at`-th epoch of its first run."""

    def __init__(self, marker: Path, at: int):
        self.marker, self.at, self.calls = marker, at, 0

    def __call__(self, df):
        self.calls += 1
        if self.calls == self.at and not self.marker.exists():
            self.marker.touch()
            raise RuntimeError("injected epoch failure")
        return df.selectExpr("key", "upper(cast(value as string)) AS value")


def test_kafka_to_kafka_is_exactly_once_across_a_failover(spark, kafka: KafkaTestClient, new_topic, tmp_path):
    from sparkpoint import Pipeline, Settings
    from sparkpoint.runtime.jobmaster import JobMaster
    from sparkpoint.runtime.status import JobStatus

    source_topic, sink_topic = new_topic(partitions=2), new_topic(partitions=1)
    kafka.produce(source_topic, [(i % 2, f"k{i}".encode(), f"event-{i}".encode()) for i in range(120)])
    source = BoundedKafkaSource(kafka.bootstrap_servers, source_topic, group_id="e2e",
                                max_records_per_partition_per_epoch=20, client_config=FAST_RECONNECT,
                                until={f"{source_topic}:0": 60, f"{source_topic}:1": 60})
    sink = KafkaSink(kafka.bootstrap_servers, sink_topic, key_column="key", value_column="value",
                     staging_dir=str(tmp_path / "staging"), client_config=FAST_RECONNECT)
    pipeline = (Pipeline("kafka-e2e").source(source)
                .transform(FailOnce(tmp_path / "failed-once", at=3)).sink(sink))
    settings = Settings.load(overrides={
        "pipeline.name": "kafka-e2e", "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "execution.checkpointing.interval": "200 ms",
        "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": 100,
        "sparkpoint.progress": False})

    result = JobMaster(pipeline, settings, spark=spark).run()

    assert result.status == JobStatus.FINISHED
    assert result.restarts == 1
    out = sorted(v for *_, v in kafka.read_committed(sink_topic))
    assert out == sorted(f"EVENT-{i}".encode() for i in range(120))   # none lost, none twice
    assert kafka.committed_offsets("e2e", source_topic, 2) == {0: 60, 1: 60}
