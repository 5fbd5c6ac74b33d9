"""One shared SparkSession with Spark's Kafka connector, and factories for topics and
records on the run's Kafka broker (the `kafka_broker` fixture of tests/conftest.py)."""

from __future__ import annotations

from typing import Callable, Iterator

import pytest

from kafka_support import KafkaTestClient
from tests.servers.kafka_broker import KafkaBroker, ensure_kafka_jars
from tests.servers.names import unique_name


@pytest.fixture(scope="session")
def kafka(kafka_broker: KafkaBroker) -> Iterator[KafkaTestClient]:
    client = KafkaTestClient(kafka_broker.bootstrap_servers)
    yield client
    client.close()


@pytest.fixture(scope="session")
def spark():
    from sparkpoint.connectors.kafka_common import add_spark_connector
    from sparkpoint.runtime.spark import get_or_create_spark

    # The one session of this test process, plus Spark's own Kafka connector so both
    # readers of KafkaSource are tested.
    ensure_kafka_jars(spark_connector=True)
    session = get_or_create_spark("local[2]", "tests", 2)
    add_spark_connector(session)
    return session


@pytest.fixture
def new_topic(kafka: KafkaTestClient, request: pytest.FixtureRequest) -> Callable[..., str]:
    """new_topic(partitions=2) -> the name of a fresh topic for this test."""

    def make(partitions: int = 2) -> str:
        name = unique_name(request.node.name)
        kafka.create_topic(name, partitions)
        return name

    return make
