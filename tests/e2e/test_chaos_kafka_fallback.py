"""Found by `sparkpoint chaos --storm` on Kafka source and sink (seed 1, fault corrupt):
the newest checkpoint is damaged after the Kafka sink published it, the restart falls
back to an older checkpoint, and the records of the epochs in between are published a
second time (the sink logs "the records in between are published again"): 291 rows
duplicated (3 epochs x 97 users), 0 lost. Parquet and Delta withdraw output committed
after the checkpoint they fall back to; a Kafka transaction cannot be withdrawn, but the
epochs replayed from the restored offsets are the same epochs with the same output, so
what was published must not be published again.

A known defect, not fixed yet: the epochs replayed after a fall-back are planned again
(a Kafka source reads up to its new end), so their output is the same only if each epoch's
slice is replayed as it was first planned, which needs a durable log of epoch plans (as
Spark's offset log is). Until then `make chaos` runs this test as an expected failure and
reports it; `make test` leaves it out (7 minutes for a known result).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.test_chaos_storm import (
    KAFKA_EVENTS_PER_SEED,
    KafkaTopics,
    _out,
    _produce,
    _storm,
    kafka_oracle,
    kafka_pipeline,
    topics,  # noqa: F401 - the fixture
)

pytestmark = [
    pytest.mark.e2e, pytest.mark.spark, pytest.mark.kafka,
    pytest.mark.skipif(not os.environ.get("SPARKPOINT_CHAOS_KNOWN_DEFECTS"),
                       reason="a known defect, reproduced by `make chaos`"),
    pytest.mark.xfail(strict=True, reason="a fall-back past a published checkpoint publishes the epochs in "
                                          "between again: epoch plans are not replayed as first planned"),
]


def test_kafka_output_is_not_published_twice_when_restore_falls_back_past_a_corrupt_checkpoint(
        tmp_path: Path, kafka_broker, topics: KafkaTopics) -> None:  # noqa: F811
    count = KAFKA_EVENTS_PER_SEED + KAFKA_EVENTS_PER_SEED // 2
    _produce(kafka_broker.bootstrap_servers, topics, count)
    pipeline = tmp_path / "kafka_pipeline.py"
    pipeline.write_text(kafka_pipeline(kafka_broker.bootstrap_servers, topics))
    report = _storm(tmp_path, pipeline, _out(tmp_path, "kafka-fallback"), 1, 1, kafka_oracle(count),
                    faults="corrupt")
    (verdict,) = report["faults"]
    assert verdict["injected"].startswith("SIGKILL, "), verdict  # a checkpoint was damaged
    assert (verdict["lost"], verdict["duplicated"], verdict["unexpected"]) == (0, 0, 0), verdict
