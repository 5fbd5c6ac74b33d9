"""Kafka -> keyed running totals -> Kafka as real `sparkpoint run`
processes of examples/kafka_pipeline.py, SIGKILLed twice at random moments (the second
after a checkpoint of its run completed); the last run sees the broker restart while it
reads, then the broker stopped while checkpoint commits are due, and is stopped with
SIGTERM (a last checkpoint) once its output caught up. The output topic, read with
read_committed, equals record for record the running totals folded from the input topic
epoch by epoch (`expected_records`; no failure-free reference job); the consumer group
holds the last checkpoint's offsets; the broker outages fail no checkpoint and cause no
failover.

All input is produced before any run, so epoch boundaries are a pure function of
the restored positions and even the update-mode output is known in advance.
Set SPARKPOINT_CHAOS_SEED to replay the kill moments of a failed run.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.storage.metadata import decode
from tests.e2e.harness import REPO, Job, Proc
from tests.servers.names import unique_name

pytestmark = [pytest.mark.e2e, pytest.mark.kafka, pytest.mark.spark]

EXAMPLE = REPO / "examples" / "kafka_pipeline.py"
CONFIG = REPO / "examples" / "kafka_pipeline.yaml"
PRODUCER = REPO / "examples" / "produce_events.py"
JOB_NAME = "kafka-example"   # the example's Pipeline name
EVENTS, USERS, PARTITIONS = 60_000, 300, 3
PER_EPOCH = 4_000            # per partition: 5 epochs of data
SUMMARY = re.compile(r"job \S+ (\w+): .* (\d+) checkpoints completed, (\d+) failed, (\d+) restarts")


@dataclass
class KafkaJob(Job):
    """The example pipeline, launched as `sparkpoint run examples/kafka_pipeline.py
    --config examples/kafka_pipeline.yaml`, with its topics from the environment."""

    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.file = EXAMPLE
        self.out = self.root / "unused"

    def args(self, extra: list[str] | None = None) -> list[str]:
        cmd = super().args(extra)
        at = cmd.index(str(EXAMPLE)) + 1
        return cmd[:at] + ["--config", str(CONFIG)] + cmd[at:]

    def start(self, extra: list[str] | None = None) -> Proc:
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1", **self.env)
        return Proc(subprocess.Popen(self.args(extra), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=self.root, env=env,
                                     start_new_session=True))

    def last_checkpoint(self) -> tuple[int, CompletedCheckpointData]:
        """The newest completed checkpoint, read from its `_metadata`."""
        job_dir = self.root / "checkpoints" / JOB_NAME
        completed = sorted((int(p.parent.name[4:]), p) for p in job_dir.glob("chk-*/_metadata"))
        assert completed, f"no completed checkpoint in {job_dir}"
        checkpoint_id, path = completed[-1]
        return checkpoint_id, decode(path.read_bytes(), JOB_NAME, str(path))


def positions_of(data: CompletedCheckpointData) -> dict[str, int]:
    return {s: int(o) for s, o in data.handles["source:kafka"]["positions"].items()}


def kafka_job(root: Path, bootstrap: str, input_topic: str, output_topic: str, bounded: bool) -> KafkaJob:
    return KafkaJob(root, env={
        "SPARKPOINT_KAFKA_BOOTSTRAP": bootstrap, "SPARKPOINT_KAFKA_INPUT": input_topic,
        "SPARKPOINT_KAFKA_OUTPUT": output_topic, "SPARKPOINT_KAFKA_GROUP": f"group-{output_topic}",
        "SPARKPOINT_KAFKA_MAX_PER_EPOCH": str(PER_EPOCH),
        "SPARKPOINT_KAFKA_BOUNDED": "1" if bounded else "0"})


def read_committed(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    """Every (key, value) a read_committed consumer sees in `topic` (one partition)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "e2e-reader",
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

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "e2e-input-reader",
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
    totals: dict[str, tuple[int, int, int, int]] = {}
    out: list[tuple[bytes, bytes]] = []
    epoch = 0
    while any(epoch * PER_EPOCH < len(values) for values in partitions):
        touched = set()
        for values in partitions:
            for raw in values[epoch * PER_EPOCH:(epoch + 1) * PER_EPOCH]:
                event = json.loads(raw)
                user, amount = event["user"], event["amount"]
                c = totals.get(user)
                totals[user] = (1, amount, amount, amount) if c is None else (
                    c[0] + 1, max(c[1], amount), min(c[2], amount), c[3] + amount)
                touched.add(user)
        for user in touched:
            n, high, low, total = totals[user]
            out.append((user.encode(), json.dumps({"count": n, "max": high, "min": low, "sum": total, "user": user},
                                                  sort_keys=True).encode()))
        epoch += 1
    return sorted(out)


def end_offsets(bootstrap: str, topic: str) -> dict[str, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "e2e-reader"})
    try:
        return {f"{topic}:{p}": consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in range(PARTITIONS)}
    finally:
        consumer.close()


def sink_marker(bootstrap: str, job: KafkaJob, topic: str) -> int:
    """The newest checkpoint id the Kafka sink published (its commit marker)."""
    from confluent_kafka import Consumer, TopicPartition

    handle = job.last_checkpoint()[1].handles["sink:kafka"]
    consumer = Consumer({"bootstrap.servers": bootstrap,
                         "group.id": f"{handle['transactional_id']}.{handle['generation']}.commits"})
    try:
        return consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
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


@dataclass(frozen=True)
class Topics:
    input: str
    chaos: str


@pytest.fixture(scope="module")
def topics(kafka_broker) -> Topics:
    """Topics of this module's own on the run's broker, with all input produced."""
    made = Topics(unique_name("kafka-e2e-events"), unique_name("kafka-e2e-totals-chaos"))

    def produce(count: int, output_topic: str) -> None:
        subprocess.run([sys.executable, str(PRODUCER), "--bootstrap-servers",
                        kafka_broker.bootstrap_servers, "--topic", made.input, "--output-topic", output_topic,
                        "--count", str(count), "--users", str(USERS),
                        "--partitions", str(PARTITIONS)],
                       check=True, capture_output=True, timeout=120)

    produce(EVENTS, made.chaos)
    return made


def _summary(proc: Proc) -> tuple[str, int, int, int]:
    m = SUMMARY.search(proc.text)
    assert m, proc.text[-3000:]
    return m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))


def _kill_at_random_moments(job: KafkaJob, rng: random.Random, kills: int) -> list[str]:
    notes = []
    for round_ in range(kills):
        proc = job.start()
        try:
            if round_ == 0:
                proc.wait_for(r"job status \S+ -> RUNNING", timeout=240)
                delay = rng.uniform(1.0, 8.0)
            else:
                # After a checkpoint of this run, so every run moves the job forward.
                proc.wait_for(r"completed checkpoint \d+ of job", timeout=240)
                delay = rng.uniform(0.0, 3.0)
            time.sleep(delay)
            assert proc.popen.poll() is None, proc.text[-3000:]
        finally:
            proc.kill9()
            (job.root / f"run-{round_ + 1}.log").write_text(proc.text)
        notes.append(f"run {round_ + 1} killed {delay:.1f}s later")
    return notes


def _wait_until(condition, timeout_s: float, what: str, proc: Proc) -> None:
    """Polls state outside the job (topics, consumer groups) until `condition()`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except Exception:  # the broker is still starting: ask again
            pass
        assert proc.popen.poll() is None, f"the job exited while waiting for {what}:\n" + proc.text[-3000:]
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + proc.text[-3000:]
        time.sleep(0.5)


def test_kafka_pipeline_is_exactly_once_across_sigkills_and_a_broker_restart(topics, kafka_broker_to_restart,
                                                                            tmp_path):
    broker = kafka_broker_to_restart   # restarted and stopped below
    bootstrap = broker.bootstrap_servers
    seed = int(os.environ.get("SPARKPOINT_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    timings: dict[str, float] = {}
    ends = end_offsets(bootstrap, topics.input)

    partitions = read_partitions(bootstrap, topics.input)
    assert [len(values) for values in partitions] == [ends[f"{topics.input}:{p}"] for p in range(PARTITIONS)]
    expected = expected_records(partitions)
    final_counts: dict[bytes, int] = {}
    for key, value in expected:
        final_counts[key] = max(final_counts.get(key, 0), json.loads(value)["count"])
    assert sum(final_counts.values()) == EVENTS     # every event counted once

    # Unbounded, as Kafka jobs are: two SIGKILLs at random moments.
    started = time.monotonic()
    job = kafka_job(tmp_path / "chaos", bootstrap, topics.input, topics.chaos, bounded=False)
    notes = _kill_at_random_moments(job, rng, kills=2)
    timings["kills"] = time.monotonic() - started

    started = time.monotonic()
    final = job.start()
    try:
        final.wait_for(r"job status \S+ -> RUNNING", timeout=240)
        # The broker restarts while epochs are being read...
        time.sleep(rng.uniform(0.5, 3.0))
        broker.restart()
        _wait_until(lambda: group_offsets(bootstrap, f"group-{topics.chaos}", topics.input) == ends, 300,
                    "the job to catch up", final)
        # ...and then goes away while checkpoints keep completing: their sink and offset
        # commits are due with no broker.
        mark = len(final.lines)
        broker.stop()
        final.wait_for(r"completed checkpoint \d+ of job", timeout=120, start_at=mark)
        final.wait_for(r"completed checkpoint \d+ of job", timeout=120, start_at=len(final.lines))
        broker.start()
        after = int(final.wait_for(r"completed checkpoint (\d+) of job", timeout=120,
                                   start_at=len(final.lines)).group(1))
        # The sink's commit marker reaches a checkpoint completed after the broker returned.
        # (A commit caught in the outage may take the sink's 60 s timeout to give up.)
        _wait_until(lambda: sink_marker(bootstrap, job, topics.chaos) >= after, 200,
                    f"the sink to publish checkpoint {after}", final)
        final.popen.send_signal(signal.SIGTERM)   # stops with a last checkpoint
        assert final.wait(timeout=120) == 0, final.text[-3000:]
    finally:
        if final.popen.poll() is None:
            final.kill9()
        (job.root / "run-final.log").write_text(final.text)
    timings["final run"] = time.monotonic() - started

    status, _completed, _failed, restarts = _summary(final)
    context = f"seed {seed}: {notes}; timings {timings}; logs in {job.root}"
    assert (status, restarts) == ("FINISHED", 0), f"{context}\n{final.text[-3000:]}"
    assert "failing over" not in final.text, f"{context}\n{final.text[-3000:]}"
    # Only failures that never count (a trigger racing the job's end) are allowed.
    assert final.count(r"consecutive counted failures") == 0, f"{context}\n{final.text[-3000:]}"
    # The source noticed the outage and idled through it.
    assert final.count(r"Kafka source kafka: .* reading nothing until the brokers answer") >= 1, context

    got = sorted(read_committed(bootstrap, topics.chaos))
    assert len(got) == len(expected), f"{context}: {len(got)} records vs {len(expected)}"
    assert got == expected, context

    # The consumer group holds the offsets of the last completed checkpoint: all input.
    checkpoint_id, data = job.last_checkpoint()
    assert checkpoint_id >= after, context
    assert positions_of(data) == ends, context
    assert group_offsets(bootstrap, f"group-{topics.chaos}", topics.input) == ends, context
    print(f"kafka e2e {context}")


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
