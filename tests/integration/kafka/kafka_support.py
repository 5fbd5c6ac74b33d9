"""Producing and reading records in tests with plain confluent-kafka clients; a source
that ends by itself."""

from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from sparkpoint.connectors.base import Positions
from sparkpoint.connectors.kafka_source import KafkaSource

# Clients reconnect fast after a broker restart instead of backing off for seconds.
FAST_RECONNECT = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500}


class KafkaTestClient:
    def __init__(self, bootstrap_servers: str):
        self.bootstrap_servers = bootstrap_servers
        self.admin = AdminClient({"bootstrap.servers": bootstrap_servers})
        self._producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 1})

    def create_topic(self, name: str, partitions: int) -> None:
        self.admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)

    def add_partitions(self, name: str, total: int) -> None:
        self.admin.create_partitions([NewPartitions(name, total)])[name].result(30)
        # The producer learns of the new partition with its next metadata refresh.
        deadline = time.monotonic() + 30
        while len(self._producer.list_topics(name, timeout=10).topics[name].partitions) < total:
            assert time.monotonic() < deadline, f"partition count of {name} never reached {total}"
            time.sleep(0.1)

    def produce(self, topic: str, records: Iterable[tuple[int, bytes | None, bytes]],
                timestamp_ms: int | None = None) -> None:
        """records: (partition, key, value)."""
        extra: dict[str, Any] = {"timestamp": timestamp_ms} if timestamp_ms else {}
        for partition, key, value in records:
            self._producer.produce(topic, value=value, key=key, partition=partition, **extra)
        assert self._producer.flush(30) == 0

    def read_committed(self, topic: str, partitions: int = 1) -> list[tuple[int, int, bytes | None, bytes]]:
        """Every record a read_committed consumer sees now: (partition, offset, key, value)."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap_servers, "group.id": "test-reader",
                             "isolation.level": "read_committed", "enable.partition.eof": True,
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out, at_eof = [], set()
        try:
            while len(at_eof) < partitions:
                msg = consumer.poll(10)
                assert msg is not None, f"no EOF from {topic} within 10s"
                if msg.error():
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    at_eof.add(msg.partition())
                    continue
                out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
        finally:
            consumer.close()
        return sorted(out)

    def committed_offsets(self, group: str, topic: str, partitions: int) -> Mapping[int, int]:
        consumer = Consumer({"bootstrap.servers": self.bootstrap_servers, "group.id": group})
        try:
            found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        finally:
            consumer.close()
        return {tp.partition: tp.offset for tp in found}

    def close(self) -> None:
        self._producer.flush(10)


class BoundedKafkaSource(KafkaSource):
    """Finishes once every partition reached `until`, so the job ends by itself."""

    def __init__(self, *args: Any, until: Positions, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.until = until

    def is_exhausted(self, positions: Positions) -> bool:
        return all(int(positions.get(s, 0)) >= end for s, end in self.until.items())
