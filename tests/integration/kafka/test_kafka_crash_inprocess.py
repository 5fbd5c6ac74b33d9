"""Kafka -> keyed running totals -> Kafka: examples/kafka_pipeline.py, run in-process
(tests/inprocess.py) on the shared session, crashes twice: once after a checkpoint's
`_metadata` is durable and before its Kafka transaction commits (the restore must commit
it, once), once right after the sink committed a checkpoint's transaction (the restore
must not publish it again). The last run sees the broker restart while it reads, then
the broker stopped while checkpoint commits are due, and is stopped with a last
checkpoint (what SIGTERM asks for) once its output caught up. The output topic, read with
read_committed, equals record for record the running totals folded from the input topic
epoch by epoch (`expected_records`; no failure-free reference job); the consumer group
holds the last checkpoint's offsets; the broker outages fail no checkpoint and cause no
failover.

All input is produced (by examples/produce_events.py) before any run, so epoch
boundaries are a pure function of the restored positions and even the update-mode output
is known in advance. A real SIGKILL of a Kafka source and sink job (driver, JVM, Python
workers) is the Kafka storm of tests/e2e/test_chaos_storm.py.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from sparkpoint.runtime.status import JobStatus
from tests.e2e.chaos_oracles import user_totals_records
from tests.e2e.harness import REPO
from tests.inprocess import CrashPoint, job_settings, restart, start
from tests.servers.names import unique_name

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

EXAMPLE = REPO / "examples" / "kafka_pipeline.py"
PRODUCER = REPO / "examples" / "produce_events.py"
JOB_NAME = "kafka-example"   # the example's Pipeline name
EVENTS, USERS, PARTITIONS = 60_000, 300, 3
PER_EPOCH = 4_000            # per partition: 5 epochs of data
COMPLETED = r"completed checkpoint (\d+) of job"
_loads = itertools.count()


def example_pipeline(bootstrap: str, input_topic: str, output_topic: str):
    """The example's Pipeline, its settings from the environment as `sparkpoint run`
    would read them (a fresh module each time: it reads them at import)."""
    env = {"SPARKPOINT_KAFKA_BOOTSTRAP": bootstrap, "SPARKPOINT_KAFKA_INPUT": input_topic,
           "SPARKPOINT_KAFKA_OUTPUT": output_topic, "SPARKPOINT_KAFKA_GROUP": f"group-{output_topic}",
           "SPARKPOINT_KAFKA_MAX_PER_EPOCH": str(PER_EPOCH), "SPARKPOINT_KAFKA_BOUNDED": "0"}
    spec = importlib.util.spec_from_file_location(f"kafka_example_{next(_loads)}", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    with mock.patch.dict(os.environ, env):
        spec.loader.exec_module(module)
    return module.pipeline


def settings(root: Path):
    """examples/kafka_pipeline.yaml's checkpointing and failure settings, the harness's
    directories and interval. Epochs are never cut by time: the oracle folds the input in
    epochs of PER_EPOCH records per partition, and on a loaded machine an epoch may take
    longer than the sizer's ceiling (a quarter of the 60 s timeout), which would cut the
    next ones smaller and change the update-mode output (not its correctness)."""
    return job_settings(root, JOB_NAME, **{"execution.checkpointing.timeout": "60 s",
                                           "execution.checkpointing.tolerable-failed-checkpoints": 10,
                                           "sparkpoint.epoch.max-duration": 0})


def read_committed(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    """Every (key, value) a read_committed consumer sees in `topic` (one partition)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "inprocess-reader",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    records = []
    try:
        while True:
            msg = consumer.poll(30)
            assert msg is not None, f"no end of {topic} within 30 s"
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                return records
            records.append((msg.key(), msg.value()))
    finally:
        consumer.close()


def read_partitions(bootstrap: str, topic: str) -> list[list[bytes]]:
    """Every record value of `topic`, per partition in offset order."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "inprocess-input-reader",
                         "enable.partition.eof": True, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    values: list[list[bytes]] = [[] for _ in range(PARTITIONS)]
    at_end: set[int] = set()
    try:
        while len(at_end) < PARTITIONS:
            msg = consumer.poll(30)
            assert msg is not None, f"no end of {topic} within 30 s"
            if msg.error():
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            assert msg.offset() == len(values[msg.partition()]), "offsets of the input are contiguous"
            values[msg.partition()].append(msg.value())
    finally:
        consumer.close()
    return values


def expected_records(partitions: list[list[bytes]]) -> list[tuple[bytes, bytes]]:
    """What the example commits for this input, folded without Spark: epoch e reads offsets
    [e * PER_EPOCH, (e + 1) * PER_EPOCH) of every partition, and every user it touched
    gets one record with its running totals (examples/kafka_pipeline.py's to_kafka_records)."""
    epochs = -(-max((len(values) for values in partitions), default=0) // PER_EPOCH)

    def events(epoch: int):
        for values in partitions:
            for raw in values[epoch * PER_EPOCH:(epoch + 1) * PER_EPOCH]:
                event = json.loads(raw)
                yield event["user"], event["amount"]

    return sorted((user.encode(), value.encode())
                  for user, value in user_totals_records(events(e) for e in range(epochs)))


def end_offsets(bootstrap: str, topic: str) -> dict[str, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "inprocess-reader"})
    try:
        return {f"{topic}:{p}": consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in range(PARTITIONS)}
    finally:
        consumer.close()


def group_offsets(bootstrap: str, group: str, topic: str) -> dict[str, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
    finally:
        consumer.close()
    return {f"{tp.topic}:{tp.partition}": tp.offset for tp in found}


def sink_marker(bootstrap: str, handle: dict, topic: str) -> int:
    """The newest checkpoint id the Kafka sink published (its commit marker)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap,
                         "group.id": f"{handle['transactional_id']}.{handle['generation']}.commits"})
    try:
        return consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        consumer.close()


def after_a_kafka_commit() -> CrashPoint:
    """Right after the sink committed a checkpoint of this run: its transaction is
    visible, and the run dies before doing anything more."""
    return CrashPoint("right after a Kafka transaction committed",
                      lambda e, done: e.seam == "sink" and e.what == "commit" and e.after and done >= 1)


def _wait_until(condition, timeout_s: float, what: str, run) -> None:
    """Polls state outside the job (topics, consumer groups) until `condition()`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except Exception:  # noqa: BLE001 - the broker is still starting: ask again
            pass
        assert run.error is None and not run.switch.crashed and run.result is None, \
            f"the run ended while waiting for {what}:\n{run.tail()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{run.tail()}"
        time.sleep(0.5)


def test_the_kafka_example_is_exactly_once_across_two_crashes_and_a_broker_restart(
        spark, kafka_broker_to_restart, tmp_path):
    broker = kafka_broker_to_restart   # restarted and stopped below
    bootstrap = broker.bootstrap_servers
    seed = int(os.environ.get("SPARKPOINT_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    input_topic, output_topic = unique_name("kafka-inprocess-events"), unique_name("kafka-inprocess-totals")
    subprocess.run([sys.executable, str(PRODUCER), "--bootstrap-servers", bootstrap, "--topic", input_topic,
                    "--output-topic", output_topic, "--count", str(EVENTS), "--users", str(USERS),
                    "--partitions", str(PARTITIONS)], check=True, capture_output=True, timeout=120)
    ends = end_offsets(bootstrap, input_topic)
    partitions = read_partitions(bootstrap, input_topic)
    assert [len(values) for values in partitions] == [ends[f"{input_topic}:{p}"] for p in range(PARTITIONS)]
    expected = expected_records(partitions)
    final_counts: dict[bytes, int] = {}
    for key, value in expected:
        final_counts[key] = max(final_counts.get(key, 0), json.loads(value)["count"])
    assert sum(final_counts.values()) == EVENTS     # every event counted once

    def pipeline():
        return example_pipeline(bootstrap, input_topic, output_topic)

    first = start(pipeline(), settings(tmp_path), spark, crash_at=CrashPoint.after_metadata(1)).wait_crashed()
    second = restart(first, pipeline(), spark, crash_at=after_a_kafka_commit()).wait_crashed()
    assert second.job.restored_from is not None, second.tail()

    final = restart(second, pipeline(), spark)
    try:
        final.wait_for(r"job status \S+ -> RUNNING", timeout=240)
        # The broker restarts while epochs are being read...
        time.sleep(rng.uniform(0.5, 3.0))
        broker.restart()
        _wait_until(lambda: group_offsets(bootstrap, f"group-{output_topic}", input_topic) == ends, 300,
                    "the job to catch up", final)
        # ...and then goes away while checkpoints keep completing: their sink and offset
        # commits are due with no broker.
        mark = len(final.lines)
        broker.stop()
        final.wait_for(COMPLETED, timeout=120, start_at=mark)
        final.wait_for(COMPLETED, timeout=120, start_at=len(final.lines))
        broker.start()
        after = int(final.wait_for(COMPLETED, timeout=120, start_at=len(final.lines)).group(1))
        # The sink's commit marker reaches a checkpoint completed after the broker returned.
        # (A commit caught in the outage may take the sink's 60 s timeout to give up.)
        _wait_until(lambda: sink_marker(bootstrap, final.job.coordinator.completed_store.latest().handles[
            "sink:kafka"], output_topic) >= after, 200, f"the sink to publish checkpoint {after}", final)
        final.job.stop(savepoint=False).result(120)   # what SIGTERM asks for: a last checkpoint
        result = final.wait(120)
    finally:
        if final.result is None and final.error is None:
            final.crash("the test failed")
        broker.start()

    context = f"seed {seed}; crashes: {first.switch.where}; {second.switch.where}"
    assert (result.status, result.restarts) == (JobStatus.FINISHED, 0), f"{context}\n{final.tail()}"
    assert "failing over" not in final.text, f"{context}\n{final.tail()}"
    # Only failures that never count (a trigger racing the job's end) are allowed.
    assert final.count(r"consecutive counted failures") == 0, f"{context}\n{final.tail()}"
    # The source noticed the outage and idled through it.
    assert final.count(r"Kafka source kafka: .* reading nothing until the brokers answer") >= 1, context

    got = sorted(read_committed(bootstrap, output_topic))
    assert len(got) == len(expected), f"{context}: {len(got)} records vs {len(expected)}"
    assert got == expected, context

    # The consumer group holds the offsets of the last completed checkpoint: all input.
    last = final.job.coordinator.completed_store.latest()
    assert last.checkpoint_id >= after, context
    assert {s: int(o) for s, o in last.handles["source:kafka"]["positions"].items()} == ends, context
    assert group_offsets(bootstrap, f"group-{output_topic}", input_topic) == ends, context


def test_a_source_whose_broker_is_unreachable_reads_nothing_instead_of_failing(monkeypatch, caplog):
    """What keeps the job above running through the outage, without a broker or Spark."""
    import socket

    from sparkpoint.connectors import kafka_source
    from sparkpoint.connectors.base import SourceContext
    from sparkpoint.connectors.kafka_source import KafkaSource
    from sparkpoint.errors import KafkaConnectorError

    monkeypatch.setattr(kafka_source, "_PLAN_TIMEOUT_S", 0.5)
    with socket.socket() as s:   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    source = KafkaSource(f"127.0.0.1:{port}", "events", reader="confluent", bounded=True)
    source.open(SourceContext(spark=None, job_name="unreachable"))
    positions = {"events:0": 7, "events:1": 3}
    try:
        with pytest.raises(KafkaConnectorError):   # a fresh start has nothing to go on
            source.discover({})
        assert source.discover(positions) == positions
        plan = source.plan(positions)
        assert plan.empty and plan.start == positions
        assert source.is_exhausted(positions) is False   # cannot know the end: keep going
        assert source.lag(positions) == {}
    finally:
        source.close()
    warnings = [r for r in caplog.records if "reading nothing until the brokers answer" in r.getMessage()]
    assert len(warnings) == 1   # rate-limited: one line, not one per call
