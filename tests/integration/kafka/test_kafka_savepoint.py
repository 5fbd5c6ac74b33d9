"""Kafka -> PySpark -> Kafka, started from a savepoint in a new checkpoint directory,
against a real broker: the job that took the savepoint went on publishing, the new
job numbers its checkpoints from the savepoint's id + 1 (ids the first job already
published), and still every record it produces reaches the topic exactly once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from kafka_support import FAST_RECONNECT, BoundedKafkaSource, KafkaTestClient
from sparkpoint.connectors.kafka_sink import KafkaSink
from sparkpoint.storage.metadata import decode

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

JOB = "kafka-savepoint"
PARTITIONS, PER_PARTITION, PER_EPOCH = 2, 80, 5


class Tag:
    """Marks each output record with the run that produced it."""

    def __init__(self, run: str):
        self.run = run

    def __call__(self, df):
        return df.selectExpr("key", f"concat('{self.run}:', cast(value as string)) AS value")


class Run:
    """One run of the job on a thread, writing to `sink_topic`."""

    def __init__(self, spark, kafka: KafkaTestClient, root: Path, source_topic: str, sink_topic: str,
                 run: str, **extra):
        from sparkpoint import Pipeline, Settings
        from sparkpoint.runtime.jobmaster import JobMaster

        source = BoundedKafkaSource(kafka.bootstrap_servers, source_topic, group_id=JOB,
                                    max_records_per_partition_per_epoch=PER_EPOCH,
                                    client_config=FAST_RECONNECT,
                                    until={f"{source_topic}:{p}": PER_PARTITION for p in range(PARTITIONS)})
        # No staging_dir: the runtime stages beside this run's checkpoints.
        sink = KafkaSink(kafka.bootstrap_servers, sink_topic, key_column="key", value_column="value",
                         client_config=FAST_RECONNECT)
        settings = Settings.load(overrides={
            "pipeline.name": JOB, "execution.checkpointing.dir": str(root / "checkpoints"),
            "state.local.dir": str(root / "state"), "execution.checkpointing.interval": "200 ms",
            "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": 100,
            "sparkpoint.progress": False,
            "execution.checkpointing.savepoint.allowed-targets": [str(root.parent)], **extra})
        self.job = JobMaster(Pipeline(JOB).source(source).transform(Tag(run)).sink(sink), settings, spark=spark)
        self.result = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.job.run()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def wait_until(self, condition, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition(self.job):
            assert self.thread.is_alive(), f"the job ended early: {self.error or self.result}"
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)

    def join(self, timeout_s: float = 180):
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the job did not end"
        if self.error is not None:
            raise self.error
        return self.result


def test_a_savepoint_restored_into_a_new_checkpoint_directory_publishes_every_record_once(
        spark, kafka: KafkaTestClient, new_topic, tmp_path):
    from sparkpoint.runtime.status import JobStatus

    source_topic, sink_topic = new_topic(partitions=PARTITIONS), new_topic(partitions=1)
    events = {(i % PARTITIONS, i // PARTITIONS): f"event-{i}" for i in range(PARTITIONS * PER_PARTITION)}
    kafka.produce(source_topic, [(p, f"k{i}".encode(), events[p, i // PARTITIONS].encode())
                                 for i in range(PARTITIONS * PER_PARTITION) for p in [i % PARTITIONS]])

    # The first job takes a savepoint and keeps running until it has published two
    # checkpoints past it; then it is cancelled.
    first = Run(spark, kafka, tmp_path / "a", source_topic, sink_topic, "a")
    first.wait_until(lambda j: j.epoch >= 2 and j.sink.last_committed_checkpoint >= 1)
    target = tmp_path / "savepoint"
    assert first.job.trigger_savepoint(str(target)).result(60) == str(target)
    savepoint = decode((target / "_metadata").read_bytes())
    first.wait_until(lambda j: j.sink.last_committed_checkpoint >= savepoint.checkpoint_id + 2)
    first.job.cancel()
    first.join()

    # The second job starts from the savepoint with checkpoints of its own, elsewhere.
    second = Run(spark, kafka, tmp_path / "b", source_topic, sink_topic, "b",
                 **{"execution.state-recovery.path": str(target)})
    assert second.join().status is JobStatus.FINISHED
    assert second.job.restored_from == savepoint.checkpoint_id

    at = {int(s.rsplit(":", 1)[1]): int(o) for s, o in savepoint.handles["source:kafka"]["positions"].items()}
    assert sum(at.values()) < len(events), "the savepoint must leave input for the second job"
    out = [v.decode() for *_, v in kafka.read_committed(sink_topic)]
    by_first = Counter(v[2:] for v in out if v.startswith("a:"))
    by_second = Counter(v[2:] for v in out if v.startswith("b:"))
    after_savepoint = Counter(e for (p, o), e in events.items() if o >= at[p])
    before_savepoint = Counter(e for (p, o), e in events.items() if o < at[p])

    assert by_second == after_savepoint                          # none lost, none twice
    assert max(by_first.values()) == 1                           # the first job: once each, too
    assert +(before_savepoint - by_first) == Counter()           # ... up to the savepoint at least
    assert +(by_first - before_savepoint) != Counter(), "the first job must have published past the savepoint"
    assert by_second + before_savepoint == Counter(events.values())


def test_a_job_cancelled_right_after_a_savepoint_has_its_staged_records_published_once_by_a_job_elsewhere(
        spark, kafka: KafkaTestClient, new_topic, tmp_path):
    """The first job takes an intermediate savepoint and is cancelled before any checkpoint
    publishes what it staged; its checkpoint directory (where the sink staged) is deleted
    and the savepoint moved. A job with another checkpoint directory started from the moved
    savepoint publishes the first job's records up to the savepoint, and its own after it:
    each exactly once."""
    import shutil

    from sparkpoint.runtime.status import JobStatus

    source_topic, sink_topic = new_topic(partitions=PARTITIONS), new_topic(partitions=1)
    events = {(i % PARTITIONS, i // PARTITIONS): f"event-{i}" for i in range(PARTITIONS * PER_PARTITION)}
    kafka.produce(source_topic, [(p, f"k{i}".encode(), events[p, i // PARTITIONS].encode())
                                 for i in range(PARTITIONS * PER_PARTITION) for p in [i % PARTITIONS]])

    # No periodic checkpoint comes before the cancel: the savepoint's rows stay staged.
    first = Run(spark, kafka, tmp_path / "a", source_topic, sink_topic, "a",
                **{"execution.checkpointing.interval": "1 h"})
    first.wait_until(lambda j: j.epoch >= 3)
    taken = tmp_path / "a" / "savepoint"
    assert first.job.trigger_savepoint(str(taken)).result(60) == str(taken)
    first.job.cancel()
    assert first.join().status is JobStatus.CANCELED
    assert first.job.sink.last_committed_checkpoint == 0, "the first job published something"
    savepoint = decode((taken / "_metadata").read_bytes())
    moved = tmp_path / "elsewhere" / "savepoint"
    shutil.copytree(taken, moved)
    shutil.rmtree(tmp_path / "a")   # the first job's checkpoints, its staged rows, the savepoint

    second = Run(spark, kafka, tmp_path / "b", source_topic, sink_topic, "b",
                 **{"execution.state-recovery.path": str(moved)})
    assert second.join().status is JobStatus.FINISHED
    assert second.job.restored_from == savepoint.checkpoint_id

    at = {int(s.rsplit(":", 1)[1]): int(o) for s, o in savepoint.handles["source:kafka"]["positions"].items()}
    before_savepoint = Counter(e for (p, o), e in events.items() if o < at[p])
    after_savepoint = Counter(e for (p, o), e in events.items() if o >= at[p])
    assert before_savepoint and after_savepoint, "the savepoint must split the input"
    out = [v.decode() for *_, v in kafka.read_committed(sink_topic)]
    assert Counter(v[2:] for v in out if v.startswith("a:")) == before_savepoint
    assert Counter(v[2:] for v in out if v.startswith("b:")) == after_savepoint
