"""What a savepoint commits, per sink, with the real coordinator deciding (Flink's rule):
an intermediate savepoint publishes nothing, its staged output is published once by the
next checkpoint (every sink's handle is cumulative: everything staged since the last
commit), a failover to the checkpoint before the savepoint replays each row once, a
stop-with-savepoint publishes, and a new job started from an intermediate savepoint
publishes its output when it restores (two-phase-commit recovery)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa
import pytest
from sink_checkpoint_support import SINK, SinkJob
from test_kafka_sink_unit import FakeBroker, FakeMarkerConsumer, FakeProducer

from sparkpoint.connectors import delta_sink, parquet_sink
from sparkpoint.connectors.base import Sink
from sparkpoint.connectors.kafka_sink import KafkaSink


@dataclass
class Target:
    """One sink kind: how to open a sink on the output, and what a reader sees there."""

    new_sink: Callable[[], Sink]
    committed: Callable[[], list[str]]


def _parquet(tmp_path, monkeypatch) -> Target:
    out = str(tmp_path / "out")

    def new_sink() -> Sink:
        sink = parquet_sink.ParquetSink(out)
        sink.open("job")
        return sink

    def committed() -> list[str]:
        if not parquet_sink.ParquetSink(out).committed_files():
            return []
        return sorted(parquet_sink.read_committed(out).column("value").to_pylist())
    return Target(new_sink, committed)


def _delta(tmp_path, monkeypatch) -> Target:
    out = str(tmp_path / "table")

    def new_sink() -> Sink:
        sink = delta_sink.DeltaSink(out)
        sink.open("job")
        return sink

    def committed() -> list[str]:
        table = delta_sink.read_committed(out)
        return sorted(table.column("value").to_pylist()) if "value" in table.column_names else []
    return Target(new_sink, committed)


def _kafka(tmp_path, monkeypatch) -> Target:
    broker = FakeBroker()
    monkeypatch.setattr(KafkaSink, "_check_topic_exists", lambda self, timeout_s=10.0: None)
    monkeypatch.setattr(KafkaSink, "_make_producer", lambda self, transactional: FakeProducer(broker))
    monkeypatch.setattr(KafkaSink, "_make_marker_consumer", lambda self, group: FakeMarkerConsumer(broker, group))

    def new_sink() -> Sink:
        sink = KafkaSink("fake:9092", "out", staging_dir=str(tmp_path / "staging"), transaction_timeout_s=0.2)
        sink.open("job")
        return sink

    def committed() -> list[str]:
        return sorted(v.decode() for v in broker.published)
    return Target(new_sink, committed)


@pytest.fixture(params=[_parquet, _delta, _kafka], ids=["parquet", "delta", "kafka"])
def target(request, tmp_path, monkeypatch) -> Target:
    return request.param(tmp_path, monkeypatch)


def test_output_staged_before_an_intermediate_savepoint_is_committed_once_by_the_next_checkpoint(target):
    job = SinkJob(target.new_sink())
    job.epoch(0, "a0", "a1")
    job.checkpoint()
    job.epoch(1, "b0")
    job.savepoint()
    assert target.committed() == ["a0", "a1"]
    job.epoch(2, "c0")
    job.checkpoint()
    assert target.committed() == ["a0", "a1", "b0", "c0"]


def test_a_failover_after_an_intermediate_savepoint_replays_and_yields_each_row_once(target):
    """The failover restores chk-1 (a savepoint is never restored from) and replays epochs
    1 and 2. Nothing a reader saw is withdrawn, and nothing is published twice."""
    job = SinkJob(target.new_sink())
    job.epoch(0, "a0", "a1")
    job.checkpoint()
    job.epoch(1, "b0")
    job.savepoint()
    seen_before_the_failover = target.committed()
    assert job.fail_over() == 1
    job.epoch(1, "b0")
    job.epoch(2, "c0")
    job.checkpoint()
    assert target.committed() == ["a0", "a1", "b0", "c0"]
    assert seen_before_the_failover == ["a0", "a1"], "the savepoint committed output the failover replays"


def test_a_stop_with_savepoint_commits_its_output(target):
    job = SinkJob(target.new_sink())
    job.epoch(0, "a0")
    job.checkpoint()
    job.epoch(1, "b0")
    job.savepoint(terminate=True)
    assert target.committed() == ["a0", "b0"]


def test_a_new_job_started_from_an_intermediate_savepoint_commits_its_output_on_restore(target):
    """The job that took the savepoint ends before its next checkpoint; a new job restores
    the savepoint (`--from-savepoint`) and its sink's recovery publishes what the savepoint
    staged, once."""
    job = SinkJob(target.new_sink())
    job.epoch(0, "a0")
    job.checkpoint()
    job.epoch(1, "b0")
    savepoint = job.savepoint()
    assert target.committed() == ["a0"]

    restored: dict[str, Any] = dict(savepoint.handles[SINK])
    new_job_sink = target.new_sink()
    new_job_sink.recover(restored)
    assert target.committed() == ["a0", "b0"]
    new_job_sink.recover(restored)  # a crash during that restore: run again, still once
    assert target.committed() == ["a0", "b0"]


def test_a_new_job_in_another_checkpoint_directory_publishes_what_an_intermediate_savepoint_staged_once(
        tmp_path, monkeypatch):
    """The Kafka sink stages beside the job's checkpoints. The job that took an
    intermediate savepoint is cancelled before its next checkpoint and its checkpoint
    directory deleted; the savepoint is moved elsewhere; a new job with checkpoints of its
    own recovers from it: every staged row is published, once."""
    broker = FakeBroker()
    monkeypatch.setattr(KafkaSink, "_check_topic_exists", lambda self, timeout_s=10.0: None)
    monkeypatch.setattr(KafkaSink, "_make_producer", lambda self, transactional: FakeProducer(broker))
    monkeypatch.setattr(KafkaSink, "_make_marker_consumer", lambda self, group: FakeMarkerConsumer(broker, group))

    def sink_beside(checkpoints) -> KafkaSink:
        sink = KafkaSink("fake:9092", "out", transaction_timeout_s=0.2)
        sink.use_job_storage(str(checkpoints / "job" / "sinks" / "kafka"), {})  # the runtime's default
        sink.open("job")
        return sink

    job = SinkJob(sink_beside(tmp_path / "a"))
    job.epoch(0, "a0")
    job.checkpoint()
    job.epoch(1, "b0", "b1")
    job.epoch(2, "c0")
    taken = tmp_path / "a" / "job" / "savepoints" / "savepoint-2"
    taken.mkdir(parents=True)                    # as the checkpoint storage initializes it
    savepoint = job.savepoint(target=str(taken))
    job.sink.close()                             # cancelled: no checkpoint after the savepoint
    shutil.rmtree(tmp_path / "a" / "job" / "sinks")
    moved = tmp_path / "elsewhere" / "savepoint-2"
    shutil.copytree(taken, moved)                # relocatable: the copy is what the new job gets
    shutil.rmtree(tmp_path / "a")

    restored: dict[str, Any] = json.loads(json.dumps(savepoint.handles[SINK]))
    in_the_savepoint = _listing(moved)
    new_job_sink = sink_beside(tmp_path / "b")
    new_job_sink.use_savepoint(str(moved), {})
    new_job_sink.recover(restored)
    assert sorted(v.decode() for v in broker.published) == ["a0", "b0", "b1", "c0"]
    new_job_sink.recover(restored)               # a crash during that restore: run again, still once
    assert sorted(v.decode() for v in broker.published) == ["a0", "b0", "b1", "c0"]

    new_job_sink.write_epoch(3, pa.table({"value": ["d0"]}))   # the new job goes on from there
    new_job_sink.commit(new_job_sink.pre_commit(savepoint.checkpoint_id + 1))
    assert sorted(v.decode() for v in broker.published) == ["a0", "b0", "b1", "c0", "d0"]
    assert _listing(moved) == in_the_savepoint, "a new job never changes the savepoint it started from"


def _listing(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
