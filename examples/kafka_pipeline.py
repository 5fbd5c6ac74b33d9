"""Kafka -> running totals per user -> Kafka, exactly once.

Input: JSON events like {"user": "u17", "amount": 3} on the input topic (any key).
Output: one record per user and epoch in which the user had events, keyed by the
user, its value the user's running totals as JSON:
{"count": 12, "max": 9, "min": 1, "sum": 57, "user": "u17"}. The output becomes
visible to `isolation.level=read_committed` consumers when a checkpoint completes.

    python examples/produce_events.py --count 10000        # test input
    sparkpoint run examples/kafka_pipeline.py --config examples/kafka_pipeline.yaml

Settings come from environment variables (defaults in brackets):
  SPARKPOINT_KAFKA_BOOTSTRAP   bootstrap servers            [127.0.0.1:9092]
  SPARKPOINT_KAFKA_INPUT       input topic                  [events]
  SPARKPOINT_KAFKA_OUTPUT      output topic                 [user-totals]
  SPARKPOINT_KAFKA_GROUP       consumer group that gets the offsets of each
                               completed checkpoint         [sparkpoint-example]
  SPARKPOINT_KAFKA_MAX_PER_EPOCH  records per partition per epoch [10000]
  SPARKPOINT_KAFKA_BOUNDED     1: stop (final checkpoint, FINISHED) once the input
                               present at start is read; 0: run until Ctrl-C  [0]
  SPARKPOINT_KAFKA_TRANSACTION_TIMEOUT_S  seconds a checkpoint's Kafka commit may take
                               before it is given up and retried by the next [60]

Kill it with `kill -9` at any moment and run it again: it resumes from the last
completed checkpoint; the output topic holds every update exactly once.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa

from sparkpoint import KeyedAggregate, Pipeline
from sparkpoint.connectors.kafka_common import decode_json
from sparkpoint.connectors.kafka_sink import KafkaSink
from sparkpoint.connectors.kafka_source import KafkaSource

BOOTSTRAP = os.environ.get("SPARKPOINT_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
INPUT_TOPIC = os.environ.get("SPARKPOINT_KAFKA_INPUT", "events")
OUTPUT_TOPIC = os.environ.get("SPARKPOINT_KAFKA_OUTPUT", "user-totals")
GROUP = os.environ.get("SPARKPOINT_KAFKA_GROUP", "sparkpoint-example")
MAX_PER_EPOCH = int(os.environ.get("SPARKPOINT_KAFKA_MAX_PER_EPOCH", "10000"))
BOUNDED = os.environ.get("SPARKPOINT_KAFKA_BOUNDED", "0") == "1"
TRANSACTION_TIMEOUT_S = float(os.environ.get("SPARKPOINT_KAFKA_TRANSACTION_TIMEOUT_S", "60"))

EVENT_SCHEMA = "user string, amount bigint"


def parse_events(df):
    """Kafka records -> (user, amount); records that are not such JSON are dropped."""
    return (decode_json(df, EVENT_SCHEMA)
            .selectExpr("data.user AS user", "data.amount AS amount")
            .where("user IS NOT NULL AND amount IS NOT NULL"))


def to_kafka_records(totals: pa.Table) -> pa.Table:
    """Each updated total -> key: the user, value: all its totals as JSON."""
    rows = totals.to_pylist()
    return pa.table({
        "key": pa.array([r["user"] for r in rows], pa.string()),
        "value": pa.array([json.dumps(r, sort_keys=True) for r in rows], pa.string()),
    })


pipeline = (
    Pipeline("kafka-example")
    .source(KafkaSource(BOOTSTRAP, INPUT_TOPIC, starting="earliest", group_id=GROUP,
                        max_records_per_partition_per_epoch=MAX_PER_EPOCH, bounded=BOUNDED))
    .transform(parse_events)
    .stateful(KeyedAggregate("user_totals", ["user"], "amount", value_type="bigint"))
    .map_output(to_kafka_records)
    # staging_dir unset: rows wait for their checkpoint beside the job's checkpoints.
    .sink(KafkaSink(BOOTSTRAP, OUTPUT_TOPIC, key_column="key", value_column="value",
                    transaction_timeout_s=TRANSACTION_TIMEOUT_S))
)
