"""KafkaSource against a real broker: exactly the planned records, resumable from
checkpointed positions, every starting mode, new partitions, offsets committed to the
group only after a checkpoint completes."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from kafka_support import FAST_RECONNECT, KafkaTestClient
from sparkpoint.connectors.base import SourceContext
from sparkpoint.connectors.kafka_source import KafkaDataLossError, KafkaSource
from sparkpoint.errors import ConfigError

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def records(n: int, partitions: int, tag: str = "v") -> list[tuple[int, bytes, bytes]]:
    """Record i goes to partition i % partitions."""
    return [(i % partitions, f"k{i}".encode(), f"{tag}{i}".encode()) for i in range(n)]


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def open_source(spark, kafka: KafkaTestClient, topic: str, **kw) -> KafkaSource:
    source = KafkaSource(kafka.bootstrap_servers, topic, client_config=FAST_RECONNECT, **kw)
    source.open(SourceContext(spark=spark, job_name="kafka-test"))
    return source


def read_epochs(source: KafkaSource, positions: dict, epochs: int | None = None):
    """Run the epoch loop's source side; return (rows, positions after)."""
    rows = []
    while epochs is None or epochs > 0:
        plan = source.plan(positions)
        if plan.empty:
            break
        rows += [(r.partition, r.offset, r.key, r.value) for r in source.read(plan).collect()]
        positions = dict(plan.end)
        epochs = None if epochs is None else epochs - 1
    return rows, positions


@pytest.mark.parametrize("reader", ["confluent", "spark"])
def test_reads_exactly_the_produced_records_in_bounded_epochs(spark, kafka, new_topic, reader):
    topic = new_topic(partitions=2)
    kafka.produce(topic, records(30, 2))
    source = open_source(spark, kafka, topic, max_records_per_partition_per_epoch=10, reader=reader)

    positions = source.initial_positions()
    first = source.plan(positions)
    assert first.end == {f"{topic}:0": 10, f"{topic}:1": 10}
    rows, end = read_epochs(source, positions)

    assert sorted(rows) == kafka.read_committed(topic, partitions=2)
    assert len(rows) == 30 and end == {f"{topic}:0": 15, f"{topic}:1": 15}
    assert source.lag(end) == {f"{topic}:0": 0, f"{topic}:1": 0}


def test_same_plan_reads_same_records_and_columns(spark, kafka, new_topic):
    topic = new_topic(partitions=1)
    stamp = int(time.time() * 1000) - 60_000
    kafka.produce(topic, [(0, None, b"x"), (0, b"k", b"y")], timestamp_ms=stamp)
    source = open_source(spark, kafka, topic)
    plan = source.plan(source.initial_positions())

    first = source.read(plan).collect()
    again = source.read(plan).collect()

    assert first == again
    assert [r.asDict() for r in first] == [
        {"key": None, "value": b"x", "topic": topic, "partition": 0, "offset": 0, "timestamp": stamp},
        {"key": b"k", "value": b"y", "topic": topic, "partition": 0, "offset": 1, "timestamp": stamp},
    ]


def test_restore_from_checkpointed_positions_loses_and_duplicates_nothing(spark, kafka, new_topic):
    topic = new_topic(partitions=2)
    kafka.produce(topic, records(40, 2))
    before = open_source(spark, kafka, topic, max_records_per_partition_per_epoch=10)
    committed_rows, checkpoint = read_epochs(before, before.initial_positions(), epochs=1)
    # Epochs after the checkpoint run, then the job crashes: their output is lost.
    read_epochs(before, checkpoint, epochs=1)
    before.close()
    kafka.produce(topic, records(10, 2, tag="late"))

    after = open_source(spark, kafka, topic, max_records_per_partition_per_epoch=10)
    replayed, _ = read_epochs(after, dict(checkpoint))

    assert sorted(committed_rows + replayed) == kafka.read_committed(topic, partitions=2)
    assert len(committed_rows) + len(replayed) == 50


@pytest.mark.parametrize("reader", ["confluent", "spark"])
def test_aborted_transactions_are_never_read_and_open_ones_bound_the_plan(spark, kafka, new_topic, reader):
    topic = new_topic(partitions=1)
    kafka.produce(topic, [(0, None, b"before")])
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted", partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0)
    producer.flush(30)
    source = open_source(spark, kafka, topic, reader=reader)

    plan = source.plan(source.initial_positions())
    values_while_open = [r.value for r in source.read(plan).collect()]
    producer.commit_transaction(30)
    # The commit markers reach the partition shortly after commit_transaction returns.
    wait_until(lambda: not source.plan(dict(plan.end)).empty)
    values_after, _ = read_epochs(source, dict(plan.end))

    assert values_while_open == [b"before"]
    assert [v for *_, v in values_after] == [b"open"]


def test_starting_positions(spark, kafka, new_topic):
    topic = new_topic(partitions=2)
    # Recent timestamps: records older than the topic's retention may be deleted.
    old, new = int(time.time() * 1000) - 120_000, int(time.time() * 1000) - 60_000
    kafka.produce(topic, records(6, 2, tag="old"), timestamp_ms=old)
    kafka.produce(topic, records(4, 2, tag="new"), timestamp_ms=new)
    # partition 0: old0 old2 old4 new0 new2; partition 1: old1 old3 old5 new1 new3
    committer = open_source(spark, kafka, topic, group_id="g-start")
    committer.notify_checkpoint_complete(1, {f"{topic}:0": 4})
    assert committer.committer.wait_idle(30)

    def values(**kw) -> list[bytes]:
        source = open_source(spark, kafka, topic, **kw)
        rows, _ = read_epochs(source, source.initial_positions())
        return sorted(v for *_, v in rows)

    assert len(values(starting="earliest")) == 10
    assert values(starting="latest") == []
    assert values(starting={"timestamp": new}) == sorted(f"new{i}".encode() for i in range(4))
    # partition 0 from its committed offset 4; partition 1 has no commit: from earliest
    assert values(starting="committed", group_id="g-start") == sorted(
        [b"new2", b"old1", b"old3", b"old5", b"new1", b"new3"])


def test_new_partition_is_discovered_and_read_from_its_start(spark, kafka, new_topic):
    topic = new_topic(partitions=1)
    kafka.produce(topic, records(3, 1))
    source = open_source(spark, kafka, topic)
    rows, positions = read_epochs(source, source.initial_positions())

    kafka.add_partitions(topic, 2)
    kafka.produce(topic, [(1, b"p1", b"in-new-partition")])
    positions = source.discover(positions)
    more, positions = read_epochs(source, positions)

    assert positions == {f"{topic}:0": 3, f"{topic}:1": 1}
    assert [v for *_, v in more] == [b"in-new-partition"]


def test_offsets_are_committed_to_the_group_only_after_checkpoint_completion(spark, kafka, new_topic):
    topic = new_topic(partitions=2)
    kafka.produce(topic, records(10, 2))
    source = open_source(spark, kafka, topic, group_id="g-notify")
    _, positions = read_epochs(source, source.initial_positions())

    assert kafka.committed_offsets("g-notify", topic, 2) == {0: -1001, 1: -1001}
    source.notify_checkpoint_complete(7, positions)
    source.notify_checkpoint_complete(6, {f"{topic}:0": 1, f"{topic}:1": 1})  # older: ignored
    assert source.committer.wait_idle(30)

    assert kafka.committed_offsets("g-notify", topic, 2) == {0: 5, 1: 5}
    assert source.committer.committed.checkpoint_id == 7


def test_committed_start_needs_a_group():
    with pytest.raises(ConfigError, match="group_id"):
        KafkaSource("127.0.0.1:1", "t", starting="committed")


def _source_without_spark(kafka: KafkaTestClient, topic: str, **kw) -> KafkaSource:
    source = KafkaSource(kafka.bootstrap_servers, topic, client_config=FAST_RECONNECT,
                         reader="confluent", **kw)
    source.open(SourceContext(spark=None, job_name="kafka-test"))   # plan() needs no Spark
    return source


def test_a_position_above_the_partitions_end_is_data_loss_not_a_silent_skip(kafka, new_topic):
    """Defect 9: a checkpointed position past the end (topic deleted and recreated, log
    truncated) used to plan empty epochs forever, even with fail_on_data_loss=True."""
    from sparkpoint.errors import ConfigError

    topic = new_topic(partitions=2)
    kafka.produce(topic, records(10, 2))          # 5 records per partition
    checkpointed = {f"{topic}:0": 3, f"{topic}:1": 40}   # partition 1 held 40 before
    source = _source_without_spark(kafka, topic)

    with pytest.raises(KafkaDataLossError) as raised:
        source.plan(checkpointed)
    message = str(raised.value)
    assert f"{topic}:1" in message and "40" in message and "recreated" in message
    assert "fail_on_data_loss=False" in message
    assert isinstance(raised.value, ConfigError)   # not retryable: a restart hits it again
    source.close()


def test_a_position_above_the_end_is_skipped_with_a_counted_warning_when_allowed(kafka, new_topic, caplog):
    topic = new_topic(partitions=1)
    kafka.produce(topic, records(5, 1))
    source = _source_without_spark(kafka, topic, fail_on_data_loss=False)

    with caplog.at_level("WARNING", logger="sparkpoint.connectors.kafka_source"):
        plan = source.plan({f"{topic}:0": 40})

    assert plan.start == {f"{topic}:0": 5} and plan.empty       # on from the partition's end
    [warning] = [r.getMessage() for r in caplog.records if "above" in r.getMessage()]
    assert "35 offsets" in warning and "5 records" in warning
    kafka.produce(topic, [(0, None, b"new")])
    assert source.plan(dict(plan.end)).end == {f"{topic}:0": 6}
    source.close()


def test_a_bounded_source_does_not_finish_silently_on_a_position_above_the_end(kafka, new_topic):
    topic = new_topic(partitions=1)
    kafka.produce(topic, records(5, 1))
    source = _source_without_spark(kafka, topic, bounded=True)

    assert not source.is_exhausted({f"{topic}:0": 40})   # plan() then reports the loss
    with pytest.raises(KafkaDataLossError):
        source.plan({f"{topic}:0": 40})
    source.close()
