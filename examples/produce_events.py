"""Produce test events for examples/kafka_pipeline.py: JSON {"user", "amount"}
records keyed by user, the same records for the same arguments.

    python examples/produce_events.py --count 100000 --users 300 --partitions 3

Creates the input topic (with --partitions) and the pipeline's output topic (one
partition) if they do not exist yet: the test broker does not auto-create topics.
"""

from __future__ import annotations

import argparse
import json
import os
import random

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def ensure_topic(bootstrap_servers: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    if topic in admin.list_topics(timeout=30).topics:
        return
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    except KafkaException as e:
        if "TOPIC_ALREADY_EXISTS" not in str(e):
            raise


def produce_events(bootstrap_servers: str, topic: str, count: int, users: int,
                   partitions: int = 3, seed: int = 7) -> None:
    """`count` events over `users` users; the same arguments give the same records."""
    ensure_topic(bootstrap_servers, topic, partitions)
    rng = random.Random(seed)
    # Idempotence: a retried send is never written twice, so offsets are reproducible.
    producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True,
                         "linger.ms": 20})
    for i in range(count):
        user = f"u{rng.randrange(users)}"
        value = json.dumps({"user": user, "amount": rng.randint(1, 100)})
        while True:
            try:
                producer.produce(topic, key=user.encode(), value=value.encode())
                break
            except BufferError:  # local queue full: let deliveries drain it
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise SystemExit(f"some events were not acknowledged by {bootstrap_servers}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers",
                        default=os.environ.get("SPARKPOINT_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    parser.add_argument("--topic", default=os.environ.get("SPARKPOINT_KAFKA_INPUT", "events"))
    parser.add_argument("--output-topic",
                        default=os.environ.get("SPARKPOINT_KAFKA_OUTPUT", "user-totals"),
                        help="created (empty, one partition) for the pipeline to write to")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    ensure_topic(args.bootstrap_servers, args.output_topic, 1)
    produce_events(args.bootstrap_servers, args.topic, args.count, args.users, args.partitions,
                   args.seed)
    print(f"produced {args.count:,} events for {args.users} users to {args.topic}")


if __name__ == "__main__":
    main()
