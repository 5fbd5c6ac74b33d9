"""KafkaSink without a broker: fake producers and marker consumers stand in for
librdkafka, so interleavings between the epoch loop and the committer thread, hung
librdkafka calls and crafted handles can be played deterministically."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
from typing import Any

import pyarrow as pa
import pytest

from sparkpoint.connectors import kafka_sink as kafka_sink_module
from sparkpoint.connectors.kafka_sink import KafkaSink
from sparkpoint.errors import CorruptCheckpointError, KafkaConnectorError


class FakeProducer:
    """The transactional producer API the sink uses; records what was committed."""

    def __init__(self, broker: "FakeBroker"):
        self.broker = broker
        self.open: list[tuple[Any, Any]] = []
        self.in_transaction = False

    def init_transactions(self, _timeout: float) -> None:
        self.broker.inits += 1

    def begin_transaction(self) -> None:
        assert not self.in_transaction
        self.in_transaction = True

    def produce(self, topic: str, value: Any = None, key: Any = None, **_kw: Any) -> None:
        assert self.in_transaction
        self.open.append((key, value))

    def poll(self, _timeout: float = 0) -> int:
        return 0

    def flush(self, _timeout: float = 0) -> int:
        return 0

    def purge(self, *_args: Any) -> None:
        self.open = []

    def send_offsets_to_transaction(self, marker: list[Any], group: Any, _timeout: float) -> None:
        self.broker.before_marker(self)
        self.pending_marker = (group, marker[0].offset)
        self.pending_metadata = marker[0].metadata

    def commit_transaction(self, _timeout: float = 0) -> None:
        self.broker.published.extend(v for _, v in self.open)
        group, offset = self.pending_marker
        self.broker.markers[group] = offset
        self.broker.metadata[group] = self.pending_metadata
        self.open, self.in_transaction = [], False

    def abort_transaction(self, _timeout: float = 0) -> None:
        self.open, self.in_transaction = [], False


class FakeMarkerConsumer:
    """The consumer of one commit-marker group; its group metadata is the group name."""

    def __init__(self, broker: "FakeBroker", group: str):
        self.broker = broker
        self.group = group
        self.closed = False

    def consumer_group_metadata(self) -> str:
        return self.group

    def committed(self, partitions: list[Any], timeout: float = 0) -> list[Any]:
        from confluent_kafka import TopicPartition

        tp = partitions[0]
        return [TopicPartition(tp.topic, tp.partition, self.broker.markers.get(self.group, -1001),
                               metadata=self.broker.metadata.get(self.group, ""))]

    def close(self) -> None:
        self.closed = True


class FakeBroker:
    def __init__(self) -> None:
        self.published: list[bytes] = []
        self.markers: dict[str, int] = {}   # commit-marker group -> committed offset
        self.metadata: dict[str, str] = {}  # ... and the metadata committed with it
        self.inits = 0
        self.producers: list[FakeProducer] = []
        self.consumers: list[FakeMarkerConsumer] = []

    def before_marker(self, producer: FakeProducer) -> None:
        """Hook: where a test makes send_offsets_to_transaction hang."""


@pytest.fixture
def broker() -> FakeBroker:
    return FakeBroker()


@pytest.fixture
def make_sink(broker: FakeBroker, tmp_path, monkeypatch):
    monkeypatch.setattr(KafkaSink, "_check_topic_exists", lambda self, timeout_s=10.0: None)

    def producer(self: KafkaSink, transactional: bool) -> FakeProducer:
        p = FakeProducer(broker)
        broker.producers.append(p)
        return p

    def marker_consumer(self: KafkaSink, group: str) -> FakeMarkerConsumer:
        c = FakeMarkerConsumer(broker, group)
        broker.consumers.append(c)
        return c

    monkeypatch.setattr(KafkaSink, "_make_producer", producer)
    monkeypatch.setattr(KafkaSink, "_make_marker_consumer", marker_consumer)

    def make(job: str = "job", staging: str = "staging", **kw: Any) -> KafkaSink:
        sink = KafkaSink("fake:9092", "out", staging_dir=str(tmp_path / staging),
                         transaction_timeout_s=0.2, **kw)
        sink.open(job)
        return sink
    return make


def rows(*values: str) -> pa.Table:
    return pa.table({"value": list(values)})


# -- defect 5: the sealed segments are shared by the epoch loop and the committer --------
class PausingList(list):
    """A list whose iteration takes a snapshot, then waits: the committer thread's
    read-filter-assign of the sealed segments is paused between its read and its
    assignment, where the epoch loop's append used to get lost."""

    def __init__(self, items: list, reading: threading.Event, go: threading.Event):
        super().__init__(items)
        self.reading, self.go = reading, go

    def __iter__(self):
        snapshot = list.copy(self)
        self.reading.set()
        self.go.wait(5)
        return iter(snapshot)


def test_sealed_segment_appended_while_the_committer_forgets_published_ones_is_kept(make_sink, broker):
    sink = make_sink()
    sink.recover(None)
    sink.write_epoch(1, rows("a"))
    first = sink.pre_commit(1)
    reading, go = threading.Event(), threading.Event()
    sink._sealed = PausingList(sink._sealed, reading, go)

    committer = threading.Thread(target=sink.commit, args=(first,))
    committer.start()
    assert reading.wait(5)                       # the committer is inside its update
    sink.write_epoch(2, rows("b"))
    handles: list[Any] = []
    epoch_loop = threading.Thread(target=lambda: handles.append(sink.pre_commit(2)))
    epoch_loop.start()
    epoch_loop.join(0.3)                         # with a lock it waits for the committer
    go.set()
    committer.join(5)
    epoch_loop.join(5)

    assert 2 in [s["checkpoint_id"] for s in handles[0]["segments"]]
    later = sink.pre_commit(3)                   # the segment of 2 must still be sealed
    assert [s["checkpoint_id"] for s in later["segments"]] == [2, 3]
    sink.commit(later)
    assert broker.published == [b"a", b"b"]


# -- defect 15: a hung marker call leaks a producer and a thread each time --------------
def test_marker_time_outs_do_not_leak_a_producer_and_thread_each(make_sink, broker, monkeypatch):
    monkeypatch.setattr(kafka_sink_module, "_MARKER_GRACE_S", 0.05)
    release = threading.Event()
    broker.before_marker = lambda producer: release.wait(30)   # librdkafka #5456: ignores its timeout
    sink = make_sink()
    sink.recover(None)
    sink.write_epoch(1, rows("a"))
    handle = sink.pre_commit(1)

    for _ in range(6):
        with pytest.raises(KafkaConnectorError):
            sink.commit(handle)

    stuck = [t for t in threading.enumerate() if t.name.startswith("kafka-sink-marker") and t.is_alive()]
    assert len(stuck) <= 2                       # bounded, not one per time-out
    assert len(broker.producers) <= 3
    release.set()
    for t in stuck:
        t.join(5)
    broker.before_marker = lambda producer: None
    sink.commit(handle)                          # once they returned, commits work again
    assert broker.published == [b"a"]
    assert sink._stuck == []


def test_recover_closes_the_marker_consumer_it_replaces(make_sink, broker):
    sink = make_sink()
    sink.recover(None)
    sink.recover(None)
    assert [c.closed for c in broker.consumers] == [True, False]


# -- defect 15: staged file names from a handle are validated ----------------------------
def _crafted_handle(sink: KafkaSink, name: str, data: bytes) -> dict[str, Any]:
    handle = dict(sink.pre_commit(1))
    handle["segments"] = [{"checkpoint_id": 1, "staged": [
        {"name": name, "rows": 1, "sha256": hashlib.sha256(data).hexdigest()}]}]
    return handle


@pytest.mark.parametrize("name", ["../../../victim.arrow", "/etc/victim.arrow", "sub/epoch-1.arrow", "..", ""])
def test_a_crafted_staged_name_cannot_make_recover_touch_files_outside_staging(make_sink, broker, tmp_path, name):
    import io

    import pyarrow.ipc as ipc

    table = pa.table({"key": pa.array([None], pa.binary()), "value": pa.array([b"x"], pa.binary())})
    buf = io.BytesIO()
    with ipc.new_stream(buf, table.schema) as w:
        w.write_table(table)
    data = buf.getvalue()
    victim = tmp_path / "victim.arrow"
    victim.write_bytes(data)
    sink = make_sink()
    sink.recover(None)
    handle = _crafted_handle(sink, name, data)

    restored = make_sink()
    with pytest.raises(CorruptCheckpointError, match="staged file name"):
        restored.recover(handle)
    assert victim.read_bytes() == data
    assert broker.published == []


# -- defect 11: staged files are verified before anything is published -------------------
@pytest.mark.parametrize("damage", ["missing", "truncated", "flipped"])
def test_a_damaged_staged_file_of_the_restored_checkpoint_is_a_corrupt_checkpoint(make_sink, broker, damage):
    crashed = make_sink()
    crashed.recover(None)
    crashed.write_epoch(1, rows("a"))
    crashed.write_epoch(2, rows("b"))
    handle = crashed.pre_commit(1)
    victim = handle["segments"][0]["staged"][1]["name"]
    path = f"{crashed._dir}/{victim}"
    data = crashed._fs.read_bytes(path)
    if damage == "missing":
        crashed._fs.rm(path)
    elif damage == "truncated":
        crashed._fs.write_atomic(path, data[:-7])
    else:
        crashed._fs.write_atomic(path, data[:-1] + bytes([data[-1] ^ 1]))

    restored = make_sink()
    with pytest.raises(CorruptCheckpointError, match=victim):
        restored.recover(handle)
    assert broker.published == []
    assert all(not p.in_transaction for p in broker.producers)   # nothing left open

    fallback = make_sink()                     # the runtime falls back to an older checkpoint
    fallback.recover(None)
    fallback.write_epoch(1, rows("a"))
    fallback.commit(fallback.pre_commit(1))
    assert broker.published == [b"a"]


def test_an_unreadable_commit_record_does_not_crash_loop_recover(make_sink, broker):
    sink = make_sink()
    sink.recover(None)
    sink.write_epoch(1, rows("a"))
    handle = sink.pre_commit(1)
    sink.commit(handle)
    sink._fs.write_atomic(f"{sink._dir}/_committed.json", b"{not json")

    restored = make_sink()
    restored.recover(handle)                   # the marker answers: already published
    assert broker.published == [b"a"]
    assert restored.last_committed_checkpoint == 1


def test_staged_files_record_their_size(make_sink):
    sink = make_sink()
    sink.recover(None)
    sink.write_epoch(1, rows("a"))
    [staged] = sink.pre_commit(1)["segments"][0]["staged"]
    assert staged["size"] == sink._fs.size(f"{sink._dir}/{staged['name']}")
    assert json.loads(json.dumps(staged)) == staged


# -- a savepoint restored into another checkpoint directory ------------------------------
def _publish(sink: KafkaSink, checkpoint_id: int, *values: str) -> dict[str, Any]:
    sink.write_epoch(checkpoint_id, rows(*values))
    handle = sink.pre_commit(checkpoint_id)
    sink.commit(handle)
    return handle


def test_a_savepoint_restored_into_a_new_checkpoint_directory_publishes_every_new_checkpoint(make_sink, broker):
    # The job takes savepoint 1 and keeps running: checkpoints 2 and 3 are published
    # after it, so its commit marker stands at 3.
    original = make_sink(staging="job-a")
    original.recover(None)
    savepoint = _publish(original, 1, "a")
    _publish(original, 2, "b")
    _publish(original, 3, "c")
    original.close()

    # Started from the savepoint in a new checkpoint directory, the new job numbers its
    # checkpoints 2, 3, 4 and replays what came after the savepoint.
    restored = make_sink(staging="job-b")
    restored.recover(savepoint)
    _publish(restored, 2, "b")
    _publish(restored, 3, "c")
    _publish(restored, 4, "d")
    assert broker.published == [b"a", b"b", b"c", b"b", b"c", b"d"]

    # It crashes before its own first checkpoint and starts from the savepoint again:
    # the savepoint's rows are not published a third time, the new ones are.
    again = make_sink(staging="job-c")
    again.recover(savepoint)
    _publish(again, 2, "b2")
    assert broker.published == [b"a", b"b", b"c", b"b", b"c", b"d", b"b2"]


def test_a_savepoint_restored_under_another_job_name_is_not_published_again(make_sink, broker):
    original = make_sink(job="orders")
    original.recover(None)
    savepoint = _publish(original, 1, "a")
    original.close()

    renamed = make_sink(job="orders-v2")
    renamed.recover(savepoint)       # published by the job that took it, under its id
    _publish(renamed, 2, "b")
    assert broker.published == [b"a", b"b"]


def test_a_crash_restore_publishes_the_restored_checkpoint_once_and_then_every_new_one(make_sink, broker):
    crashed = make_sink()
    crashed.recover(None)
    crashed.write_epoch(1, rows("a"))
    handle = crashed.pre_commit(1)               # _metadata written, commit never ran
    crashed.write_epoch(2, rows("replayed"))     # after the barrier: replayed, never published

    restored = make_sink()
    restored.recover(handle)
    assert broker.published == [b"a"]
    assert restored.last_committed_checkpoint == 1
    _publish(restored, 2, "b")

    again = make_sink()                          # an older checkpoint restored once more
    again.recover(handle)
    _publish(again, 3, "c")
    assert broker.published == [b"a", b"b", b"c"]


def test_an_older_runs_checkpoint_is_known_published_by_its_record_once_its_marker_expired(make_sink, broker):
    first = make_sink()
    first.recover(None)
    handle = _publish(first, 1, "a")
    second = make_sink()
    second.recover(handle)
    _publish(second, 2, "b")
    broker.markers.clear()                       # the brokers expired the marker groups' offsets

    again = make_sink()
    again.recover(handle)                        # the first run's staged files are gone
    assert broker.published == [b"a", b"b"]


# -- a savepoint carries the staged rows it has not published ---------------------------
def _intermediate_savepoint(make_sink, tmp_path) -> tuple[dict[str, Any], Any]:
    """A job stages two epochs, takes a savepoint without publishing, is cancelled and its
    staging deleted: (the savepoint's handle as `_metadata` keeps it, the savepoint dir)."""
    sink = make_sink(staging="old")
    sink.recover(None)
    sink.write_epoch(1, rows("a", "b"))
    savepoint = tmp_path / "savepoint"
    handle = json.loads(json.dumps(sink.savepoint_handle(sink.pre_commit(1), str(savepoint), {})))
    sink.close()
    shutil.rmtree(tmp_path / "old")
    return handle, savepoint


def test_a_savepoint_whose_copy_of_a_staged_file_is_gone_names_it_and_publishes_nothing(
        make_sink, broker, tmp_path):
    handle, savepoint = _intermediate_savepoint(make_sink, tmp_path)
    (copy,) = (savepoint / "sinks" / "kafka").iterdir()
    copy.unlink()
    new = make_sink(staging="new")
    new.use_savepoint(str(savepoint), {})
    with pytest.raises(CorruptCheckpointError, match=f"staged file {re.escape(str(copy))} of the savepoint is missing"):
        new.recover(handle)
    assert broker.published == []


@pytest.mark.parametrize("where", ["../../outside", "sinks/../..", "/etc", "sinks/kafka/x", "sinks/.."])
def test_a_crafted_savepoint_staging_path_cannot_make_recover_read_outside_the_savepoint(
        make_sink, broker, tmp_path, where):
    handle, savepoint = _intermediate_savepoint(make_sink, tmp_path)
    new = make_sink(staging="new")
    new.use_savepoint(str(savepoint), {})
    with pytest.raises(CorruptCheckpointError, match="is not a directory the sink writes in a savepoint"):
        new.recover({**handle, "savepoint_staged": where})
    assert broker.published == []


def test_a_savepoint_does_not_copy_a_damaged_staged_file_it_has_not_published(make_sink, broker, tmp_path):
    """The savepoint fails (the runtime declines it, the job keeps running) instead of
    carrying rows that could never be published."""
    sink = make_sink()
    sink.recover(None)
    sink.write_epoch(1, rows("a"))
    handle = sink.pre_commit(1)
    (staged,) = (p for p in (tmp_path / "staging").rglob("epoch-*.arrow"))
    staged.write_bytes(staged.read_bytes()[:-1] + b"?")
    with pytest.raises(CorruptCheckpointError, match="fails its sha256 check"):
        sink.savepoint_handle(handle, str(tmp_path / "savepoint"), {})


def test_a_savepoint_skips_staged_files_the_committer_published_meanwhile(make_sink, broker, tmp_path):
    sink = make_sink()
    sink.recover(None)
    sink.write_epoch(1, rows("a"))
    sink.pre_commit(1)
    sink.write_epoch(2, rows("b"))
    handle = sink.pre_commit(2)                  # still lists segment 1 ...
    sink.commit({**handle, "checkpoint_id": 1, "segments": handle["segments"][:1]})  # ... published now
    savepoint = tmp_path / "savepoint"
    carried = sink.savepoint_handle(handle, str(savepoint), {})
    assert carried["savepoint_staged"] == "sinks/kafka"
    assert [p.name for p in (savepoint / "sinks" / "kafka").iterdir()] == \
        [f["name"] for f in handle["segments"][1]["staged"]]


# -- a restore that falls back past checkpoints already published ------------------------
def _publish_epochs(sink: KafkaSink, checkpoint_id: int, epochs: range) -> dict[str, Any]:
    for e in epochs:
        sink.write_epoch(e, rows(f"e{e}"))
    handle = sink.pre_commit(checkpoint_id)
    sink.commit(handle)
    return handle


def test_a_failover_to_an_older_checkpoint_knows_the_last_published_epoch(make_sink, broker):
    # Checkpoint 2 (epochs 0-1) and 3 (epochs 2-4) are published; then checkpoint 3 is
    # lost and the job restores checkpoint 2.
    first = make_sink()
    first.recover(None)
    two = _publish_epochs(first, 2, range(0, 2))
    _publish_epochs(first, 3, range(2, 5))
    first.close()

    again = make_sink()
    again.recover(two)
    assert again.published_epoch() == 4  # the runtime replays epochs 2-4 without handing their rows
    # A barrier after replayed epoch 3 publishes nothing and still counts epoch 4 as published.
    handle = again.pre_commit(4)
    again.commit(handle)
    _publish_epochs(again, 5, range(5, 6))
    assert broker.published == [b"e0", b"e1", b"e2", b"e3", b"e4", b"e5"]

    third = make_sink()  # and once more from checkpoint 4 (at epoch 3 by the loop's count)
    third.recover(handle)
    assert third.published_epoch() == 5


def test_a_savepoint_restore_starts_a_new_line_of_published_epochs(make_sink, broker, tmp_path):
    original = make_sink()
    original.recover(None)
    savepoint = original.savepoint_handle(_publish_epochs(original, 1, range(0, 2)), str(tmp_path / "sp"), {})
    _publish_epochs(original, 2, range(2, 4))
    original.close()

    restored = make_sink()
    restored.use_savepoint(str(tmp_path / "sp"), {})
    restored.recover(savepoint)
    assert restored.published_epoch() is None  # what came after the savepoint is published again
    _publish_epochs(restored, 3, range(2, 3))
    assert broker.published == [b"e0", b"e1", b"e2", b"e3", b"e2"]
