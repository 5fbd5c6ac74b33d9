"""How the confluent reader pulls one offset range from its consumer, without a broker.

librdkafka's batch `consume(num_messages, timeout)` returns when it holds `num_messages`
messages or when the timeout passes. A task that asks for more messages than its range
still lacks waits out the whole timeout every time; with small epochs that wait is most
of an epoch. The fake below behaves that way and records whether a call had to wait."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sparkpoint.connectors.kafka_source import OffsetRange, _read_range

EOF_CODE = -191  # KafkaError._PARTITION_EOF


@dataclass
class Error:
    code_: int

    def code(self) -> int:
        return self.code_


@dataclass
class Message:
    offset_: int
    eof: bool = False

    def error(self):
        return Error(EOF_CODE) if self.eof else None

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return f"v{self.offset_}".encode()

    def timestamp(self):
        return (1, 1_000 + self.offset_)


class BatchingConsumer:
    """A partition of `offsets` (data records; gaps are control records or aborted
    transactions, which read_committed never delivers) ending at `end`, then EOF."""

    calls: list[tuple[int, bool]] = []

    def __init__(self, offsets: list[int], end: int):
        self._queue = [Message(o) for o in offsets] + [Message(end, eof=True)]
        self.closed = False

    def assign(self, partitions) -> None:
        [tp] = partitions
        self._queue = [m for m in self._queue if m.offset() >= tp.offset]

    def consume(self, num_messages: int, timeout: float):
        waited = len(self._queue) < num_messages
        BatchingConsumer.calls.append((num_messages, waited))
        batch, self._queue = self._queue[:num_messages], self._queue[num_messages:]
        return batch

    def close(self) -> None:
        self.closed = True


def _read(monkeypatch, offsets: list[int], end: int, rng: OffsetRange) -> list[int]:
    import confluent_kafka

    BatchingConsumer.calls = []
    monkeypatch.setattr(confluent_kafka, "Consumer", lambda _config: BatchingConsumer(offsets, end))
    got = []
    for batch in _read_range({}, rng, batch_rows=65_536, stall_timeout_s=5):
        got.extend(batch.column("offset").to_pylist())
    return got


@pytest.mark.parametrize("start,end", [(0, 200), (200, 400), (3_800, 4_000)])
def test_a_range_short_of_the_partitions_end_is_read_without_waiting_for_more(monkeypatch, start, end):
    got = _read(monkeypatch, list(range(4_000)), 4_000, OffsetRange("events", 0, start, end))
    assert got == list(range(start, end))
    assert BatchingConsumer.calls and not any(waited for _, waited in BatchingConsumer.calls), \
        BatchingConsumer.calls


def test_a_range_ending_in_a_transaction_marker_ends_at_eof_without_waiting(monkeypatch):
    """Offset 200 is a commit marker (never delivered): EOF at 201 ends the range."""
    got = _read(monkeypatch, list(range(200)), 201, OffsetRange("events", 0, 0, 201))
    assert got == list(range(200))
    assert not any(waited for _, waited in BatchingConsumer.calls), BatchingConsumer.calls


def test_a_range_with_an_aborted_transaction_inside_reads_every_committed_record(monkeypatch):
    """Offsets 100-199 were aborted: read_committed skips them. The range is complete
    once its last offset arrives (a wait is allowed here, once: the consumer cannot
    know the gap in advance)."""
    offsets = [*range(100), *range(200, 300)]
    got = _read(monkeypatch, offsets, 300, OffsetRange("events", 0, 0, 300))
    assert got == offsets
    assert sum(waited for _, waited in BatchingConsumer.calls) <= 1, BatchingConsumer.calls
