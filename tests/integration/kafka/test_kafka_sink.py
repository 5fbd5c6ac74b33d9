"""KafkaSink exactly-once against a real broker: nothing visible before the
checkpoint commits, everything exactly once after any crash, zombies fenced."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kafka_support import KafkaTestClient
from sparkpoint.connectors.kafka_sink import KafkaSink
from sparkpoint.errors import KafkaConnectorError

pytestmark = pytest.mark.kafka


class SimulatedCrash(Exception):
    pass


@pytest.fixture
def make_sink(kafka: KafkaTestClient, tmp_path):
    def make(topic: str, job: str = "job", **kw) -> KafkaSink:
        sink = KafkaSink(kafka.bootstrap_servers, topic, key_column="k",
                         staging_dir=str(tmp_path / "staging"), transaction_timeout_s=20, **kw)
        sink.open(job)
        return sink
    return make


def rows(*values: str) -> pa.Table:
    return pa.table({"k": [f"key-{v}" for v in values], "value": list(values)})


def published(kafka: KafkaTestClient, topic: str) -> list[bytes]:
    return [v for *_, v in kafka.read_committed(topic)]


def test_pre_committed_rows_are_invisible_until_commit(kafka, new_topic, make_sink):
    topic = new_topic(partitions=1)
    sink = make_sink(topic)
    sink.recover(None)
    sink.write_epoch(1, rows("a", "b"))
    sink.write_epoch(2, rows("c"))

    handle = sink.pre_commit(1)
    assert published(kafka, topic) == []

    sink.commit(handle)
    assert published(kafka, topic) == [b"a", b"b", b"c"]
    assert [k for _, _, k, _ in kafka.read_committed(topic)] == [b"key-a", b"key-b", b"key-c"]
    sink.commit(handle)  # idempotent
    assert published(kafka, topic) == [b"a", b"b", b"c"]


def test_crash_between_pre_commit_and_commit_is_recovered_once(kafka, new_topic, make_sink):
    topic = new_topic(partitions=1)
    crashed = make_sink(topic)
    crashed.recover(None)
    crashed.write_epoch(1, rows("a"))
    handle = crashed.pre_commit(1)
    crashed.write_epoch(2, rows("after-barrier"))  # replayed after restore, must not appear

    restored = make_sink(topic)
    restored.recover(handle)

    assert published(kafka, topic) == [b"a"]
    again = make_sink(topic)
    again.recover(handle)  # a second failover from the same checkpoint
    assert published(kafka, topic) == [b"a"]


def test_crash_after_kafka_commit_before_recording_it_publishes_nothing_twice(
        kafka, new_topic, make_sink, monkeypatch):
    topic = new_topic(partitions=1)
    crashed = make_sink(topic)
    crashed.recover(None)
    crashed.write_epoch(1, rows("a", "b"))
    handle = crashed.pre_commit(1)
    write_atomic = crashed._fs.write_atomic

    def crash_on_commit_record(path, data):
        if path.endswith("_committed.json"):
            raise SimulatedCrash()
        write_atomic(path, data)

    monkeypatch.setattr(crashed._fs, "write_atomic", crash_on_commit_record)
    with pytest.raises(SimulatedCrash):
        crashed.commit(handle)
    assert published(kafka, topic) == [b"a", b"b"]

    restored = make_sink(topic)
    restored.recover(handle)

    assert published(kafka, topic) == [b"a", b"b"]
    assert restored.last_committed_checkpoint == 1


def test_crash_inside_the_transaction_is_aborted_and_published_once(kafka, new_topic, make_sink, monkeypatch):
    topic = new_topic(partitions=1)
    crashed = make_sink(topic)
    crashed.recover(None)
    crashed.write_epoch(1, rows("a", "b"))
    handle = crashed.pre_commit(1)

    class CrashBeforeCommit:
        def __init__(self, producer):
            self._producer = producer

        def __getattr__(self, name):
            return getattr(self._producer, name)

        def commit_transaction(self, *_args):
            self._producer.flush(20)  # the rows are on the broker, in the open transaction
            raise SimulatedCrash()

    monkeypatch.setattr(crashed, "_producer", CrashBeforeCommit(crashed._producer))
    with pytest.raises(SimulatedCrash):
        crashed.commit(handle)
    assert published(kafka, topic) == []

    restored = make_sink(topic)
    restored.recover(handle)

    assert published(kafka, topic) == [b"a", b"b"]


def test_aborted_checkpoint_rows_are_published_by_the_next_one(kafka, new_topic, make_sink):
    topic = new_topic(partitions=1)
    sink = make_sink(topic)
    sink.recover(None)
    sink.write_epoch(1, rows("a"))
    failed = sink.pre_commit(1)
    sink.write_epoch(2, rows("b"))
    pending = sink.pre_commit(2)     # concurrent with 1
    sink.abort(failed)               # 1 expires after 2 was triggered
    sink.write_epoch(3, rows("c"))
    later = sink.pre_commit(3)

    sink.commit(pending)
    assert published(kafka, topic) == [b"a", b"b"]
    sink.commit(failed)              # a late commit of an older checkpoint changes nothing
    sink.commit(later)
    assert published(kafka, topic) == [b"a", b"b", b"c"]


def test_restore_of_a_checkpoint_whose_predecessor_failed_keeps_its_rows(kafka, new_topic, make_sink):
    topic = new_topic(partitions=1)
    crashed = make_sink(topic)
    crashed.recover(None)
    crashed.write_epoch(1, rows("a"))
    crashed.pre_commit(1)            # never completes
    crashed.write_epoch(2, rows("b"))
    handle = crashed.pre_commit(2)   # completes; the job crashes before commit

    restored = make_sink(topic)
    restored.recover(handle)

    assert published(kafka, topic) == [b"a", b"b"]


def test_a_zombie_run_is_fenced(kafka, new_topic, make_sink):
    topic = new_topic(partitions=1)
    zombie = make_sink(topic)
    zombie.recover(None)
    zombie.write_epoch(1, rows("a"))
    handle = zombie.pre_commit(1)

    successor = make_sink(topic)
    successor.recover(handle)
    zombie.write_epoch(2, rows("zombie"))
    zombie_handle = zombie.pre_commit(2)

    with pytest.raises(KafkaConnectorError, match="fenced"):
        zombie.commit(zombie_handle)
    with pytest.raises(KafkaConnectorError, match="fenced"):
        zombie.commit(zombie_handle)   # and it stays fenced: it never fences the successor back
    assert published(kafka, topic) == [b"a"]
    successor.write_epoch(2, rows("b"))
    successor.commit(successor.pre_commit(2))
    assert published(kafka, topic) == [b"a", b"b"]


def test_at_least_once_publishes_at_pre_commit(kafka, new_topic, make_sink):
    topic = new_topic(partitions=1)
    sink = make_sink(topic, mode="at_least_once")
    sink.recover(None)
    sink.write_epoch(1, rows("a"))
    sink.pre_commit(1)
    assert published(kafka, topic) == [b"a"]


def test_exactly_once_needs_a_staging_dir():
    """Standalone use needs one; inside a job the runtime supplies <checkpoint dir>/<job>/sinks/<name>."""
    from sparkpoint.errors import ConfigError

    with pytest.raises(ConfigError, match="staging_dir"):
        KafkaSink("127.0.0.1:1", "t").open("job")


def test_a_missing_output_topic_refuses_to_start_with_a_clear_error(kafka, make_sink):
    """Not a failover loop on every commit: one configuration error at start."""
    from sparkpoint.errors import ConfigError

    with pytest.raises(ConfigError, match="output topic 'no-such-topic' does not exist"):
        make_sink("no-such-topic")


def test_a_fenced_run_commits_again_after_its_failover_recover(kafka, new_topic, make_sink):
    """Defect 8: recover() used to fence the other producer and then raise 'fenced' on
    every restore, so with unlimited restarts the job looped while every commit failed."""
    topic = new_topic(partitions=1)
    first = make_sink(topic)
    first.recover(None)
    first.write_epoch(1, rows("a"))
    handle = first.pre_commit(1)
    other = make_sink(topic)
    other.recover(handle)                     # takes the transactional id over
    first.write_epoch(2, rows("lost"))
    with pytest.raises(KafkaConnectorError, match="fenced"):
        first.commit(first.pre_commit(2))

    first.recover(handle)                     # the failover: restore the last checkpoint
    first.write_epoch(2, rows("b"))
    first.commit(first.pre_commit(2))
    first.write_epoch(3, rows("c"))
    first.commit(first.pre_commit(3))

    assert published(kafka, topic) == [b"a", b"b", b"c"]


def test_a_transaction_timeout_the_brokers_refuse_is_a_non_retryable_config_error(kafka, new_topic, tmp_path):
    """An error no restart cures must not become a failover loop."""
    from sparkpoint.errors import ConfigError

    topic = new_topic(partitions=1)
    sink = KafkaSink(kafka.bootstrap_servers, topic, staging_dir=str(tmp_path / "staging"),
                     transaction_timeout_s=3600)   # brokers allow 900 s by default
    sink.open("job")
    with pytest.raises(ConfigError, match="transaction.max.timeout.ms"):
        sink.recover(None)


@pytest.mark.parametrize("damage", ["missing", "flipped"])
def test_a_damaged_staged_file_makes_recover_fall_back_cleanly(kafka, new_topic, make_sink, damage):
    """Defect 11: CorruptCheckpointError naming the file, no transaction left open, and
    the older checkpoint the runtime falls back to restores and publishes."""
    from sparkpoint.errors import CorruptCheckpointError

    topic = new_topic(partitions=1)
    crashed = make_sink(topic)
    crashed.recover(None)
    crashed.write_epoch(1, rows("a"))
    older = crashed.pre_commit(1)
    crashed.write_epoch(2, rows("b"))
    crashed.write_epoch(3, rows("c"))
    latest = crashed.pre_commit(3)
    victim = latest["segments"][1]["staged"][1]["name"]
    path = f"{crashed._dir}/{victim}"
    if damage == "missing":
        crashed._fs.rm(path)
    else:
        data = crashed._fs.read_bytes(path)
        crashed._fs.write_atomic(path, data[:-1] + bytes([data[-1] ^ 1]))

    restored = make_sink(topic)
    with pytest.raises(CorruptCheckpointError, match=victim):
        restored.recover(latest)
    restored.recover(older)

    assert published(kafka, topic) == [b"a"]
    restored.write_epoch(2, rows("b2"))
    restored.commit(restored.pre_commit(3))
    assert published(kafka, topic) == [b"a", b"b2"]
