"""The contract every exactly-once sink keeps, run against each of them: Parquet on local
disk, on fsspec's `memory://` filesystem and on S3, Delta on local disk and on S3, and
Kafka (the run's shared broker), and Delta again in its merge-by-key mode.

One test class, `TestSinkContract`, holds the behaviours; the `kind` fixture is
parametrized per implementation (as Flink's `SinkTestSuiteBase` does), and gives a way
to open the sink again on the same output (a restarted process) and to read what a user
of the output sees: the committed rows only (Parquet: by following the log Spark follows,
and on local disk also by listing the directory; Delta: through delta-rs; Kafka: a
read_committed consumer). Executors are played by a pickled copy of the sink's writer,
a crash by never calling the next step and opening a fresh sink. Each behaviour checks
the output against the rows the test fed, so nothing is lost and nothing is duplicated.

Behaviours:

- stage then commit: staged rows are invisible until their checkpoint commits, then all
  of them are visible once
- commit is idempotent: the same checkpoint committed again, by the same sink or by a
  restarted one recovering from the handle in `_metadata`, publishes nothing twice
- overlapping checkpoints (the second pre-committed before the first committed) publish
  each row once, whichever commit runs first
- abort: a failed checkpoint's rows ride with the next checkpoint
- crash after `_metadata` before commit: recover on the handle publishes it, epochs
  staged after the barrier are withdrawn, and their replay is published once
- crash before `_metadata` (staged, pre-committed, never completed): recover on the
  previous checkpoint's handle withdraws it; the replay is what is published
- restore to an older checkpoint: a sink that can withdraw output (Parquet, Delta)
  withdraws what was committed after it and the replay is published once; a sink that
  cannot (Kafka) keeps it and says which epochs it already published, so the replay
  does not hand them to it again
- a restored checkpoint whose staged output is missing or damaged fails with
  CorruptCheckpointError naming the file and publishes nothing; starting afresh works
- a task attempt that staged rows and then died (a wrapper around the shipped writer,
  the fault at the executor seam) is never published; only the winning attempt is
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from pyspark import cloudpickle  # what Spark ships a writer with

from sparkpoint.connectors.base import EpochWriter, Sink
from sparkpoint.errors import CorruptCheckpointError
from sparkpoint.storage.fs import StorageFS
from tests.servers.names import unique_name


@dataclass
class SinkKind:
    """One sink implementation under test, on one output."""

    name: str
    open_sink: Callable[[], Sink]
    read: Callable[[], list[str]]
    # The staged files a pre_commit handle names, on the storage that holds them.
    staged_files: Callable[[dict[str, Any]], tuple[StorageFS, list[str]]]
    # False where the sink checks only the size of staged output it restores (an object
    # store's PUT is atomic, so a torn file cannot be there; the hash guards local disk).
    verifies_content: bool = True
    opened: list[Sink] = field(default_factory=list)

    def new(self) -> Sink:
        """The sink as a (re)started process opens it on the same output."""
        sink = self.open_sink()
        self.opened.append(sink)
        return sink

    def started(self) -> Sink:
        """A sink of a job that starts without a checkpoint."""
        sink = self.new()
        sink.recover(None)
        return sink


def rows(*values: str) -> pa.Table:
    return pa.table({"value": pa.array(list(values), pa.string())})


def stage(sink: Sink, epoch: int, *tasks: tuple[str, ...]) -> None:
    """Epoch `epoch`: each of `tasks` is one task's rows, staged by a shipped copy of the
    sink's writer (the driver gets the JSON handles), or on the driver for a sink without one."""
    writer = sink.epoch_writer()
    if writer is None:
        sink.write_epoch(epoch, rows(*[v for task in tasks for v in task]))
        return
    shipped = cloudpickle.loads(cloudpickle.dumps(writer))
    handles = [h for part, task in enumerate(tasks) for h in shipped.write(epoch, part, rows(*task))]
    sink.stage_epoch(epoch, json.loads(json.dumps(handles)))


def barrier(sink: Sink, checkpoint_id: int) -> dict[str, Any]:
    """pre_commit's handle as `_metadata` stores it and a restore reads it back."""
    return json.loads(json.dumps(sink.pre_commit(checkpoint_id)))


# -- the implementations --------------------------------------------------------------------
def _parquet(url: str, options: dict[str, Any], local: bool) -> SinkKind:
    from sparkpoint.connectors.parquet_sink import ParquetSink, read_committed

    def open_sink() -> Sink:
        sink = ParquetSink(url, storage_options=options)
        sink.open("job")
        return sink

    def read() -> list[str]:
        table = read_committed(url, options)
        got = sorted(table.column("value").to_pylist()) if table.num_rows else []
        if local:  # a plain reader listing the directory sees the same (skips `_` and `.`)
            listed = ds.dataset(url, format="parquet", partitioning="hive", ignore_prefixes=["_", "."])
            assert (sorted(listed.to_table().column("value").to_pylist()) if listed.files else []) == got
        return got

    def staged_files(handle: dict[str, Any]) -> tuple[StorageFS, list[str]]:
        storage = ParquetSink(url, storage_options=options)._storage
        return storage, [f"{storage.root}/{f['path']}" for f in handle["staged"]]

    return SinkKind("parquet", open_sink, read, staged_files, verifies_content=local)


def _delta(url: str, options: dict[str, Any], local: bool, merge: bool = False) -> SinkKind:
    from sparkpoint.connectors.delta_sink import DeltaSink, read_committed

    def open_sink() -> Sink:
        # Merging by the only column: every row fed is its own key, so the table must hold
        # exactly the rows fed (none lost, none left from withdrawn epochs). An upsert applied
        # twice cannot show as a duplicate here; tests/unit/connectors/test_delta_merge.py
        # checks by the order of updates to one key that none is applied twice or out of order.
        sink = DeltaSink(url, storage_options=options, merge_keys=["value"] if merge else None)
        sink.open("job")
        return sink

    def read() -> list[str]:
        table = read_committed(url, options)
        return sorted(table.column("value").to_pylist()) if table.num_rows else []

    def staged_files(handle: dict[str, Any]) -> tuple[StorageFS, list[str]]:
        storage = DeltaSink(url, storage_options=options)._storage
        return storage, [f"{storage.root}/{f['path']}" for f in handle["files"]]

    return SinkKind("delta-merge" if merge else "delta", open_sink, read, staged_files, verifies_content=local)


def _kafka(request: pytest.FixtureRequest, tmp_path: Path) -> SinkKind:
    from sparkpoint.connectors.kafka_sink import KafkaSink
    from tests.integration.kafka.kafka_support import KafkaTestClient

    broker = request.getfixturevalue("kafka_broker")
    topic = job = unique_name(request.node.name)
    client = KafkaTestClient(broker.bootstrap_servers)
    client.create_topic(topic, 1)

    def open_sink() -> Sink:
        sink = KafkaSink(broker.bootstrap_servers, topic, staging_dir=str(tmp_path / "staging"),
                         transaction_timeout_s=30)
        sink.open(job)
        return sink

    def read() -> list[str]:
        return sorted(value.decode() for _, _, _, value in client.read_committed(topic))

    def staged_files(handle: dict[str, Any]) -> tuple[StorageFS, list[str]]:
        storage = StorageFS.from_url(handle["staging"])
        return storage, [f"{storage.root}/{f['name']}" for seg in handle["segments"] for f in seg["staged"]]

    return SinkKind("kafka", open_sink, read, staged_files)


def _s3_url_and_options(request: pytest.FixtureRequest, name: str) -> tuple[str, dict[str, Any]]:
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/{name}", {**server.storage_options(), "skip_instance_cache": True}


@pytest.fixture(params=[
    "parquet-local",
    "parquet-memory",
    pytest.param("parquet-s3", marks=pytest.mark.s3),
    "delta-local",
    pytest.param("delta-s3", marks=pytest.mark.s3),
    "delta-merge-local",
    pytest.param("delta-merge-s3", marks=pytest.mark.s3),
    pytest.param("kafka", marks=pytest.mark.kafka),
])
def kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SinkKind]:
    if request.param == "parquet-local":
        made = _parquet(str(tmp_path / "out dir"), {}, local=True)  # a space: log URIs are encoded
    elif request.param == "parquet-memory":  # the object-store code path: copy, no rename
        made = _parquet(f"memory://sparkpoint-out-{uuid.uuid4().hex}", {}, local=False)
    elif request.param == "parquet-s3":
        made = _parquet(*_s3_url_and_options(request, "output"), local=False)
    elif request.param == "delta-local":
        made = _delta(str(tmp_path / "table dir"), {}, local=True)
    elif request.param == "delta-s3":
        made = _delta(*_s3_url_and_options(request, "table"), local=False)
    elif request.param == "delta-merge-local":
        made = _delta(str(tmp_path / "table dir"), {}, local=True, merge=True)
    elif request.param == "delta-merge-s3":
        made = _delta(*_s3_url_and_options(request, "table"), local=False, merge=True)
    else:
        made = _kafka(request, tmp_path)
    yield made
    for sink in made.opened:
        sink.close()


# -- a fault at the executor seam -------------------------------------------------------------
class AttemptDiesAfterStaging(EpochWriter):
    """Wraps a shipped writer: the first attempt of each task stages its rows and then
    its executor is lost (the handles never reach the driver); Spark runs the task again."""

    def __init__(self, inner: EpochWriter):
        self.inner = inner
        self.died: set[tuple[int, int]] = set()

    def write(self, epoch: int, part: int, rows: pa.Table) -> list[dict[str, Any]]:
        handles = self.inner.write(epoch, part, rows)
        if (epoch, part) not in self.died:
            self.died.add((epoch, part))
            raise ConnectionError(f"executor lost after staging epoch {epoch} part {part}")
        return handles


class TestSinkContract:
    def test_staged_rows_are_invisible_until_their_checkpoint_commits(self, kind: SinkKind) -> None:
        sink = kind.started()
        stage(sink, 0, ("a", "b"), ("c",))
        stage(sink, 1, (), ("d",))
        handle = barrier(sink, 1)
        stage(sink, 2, ("e",))  # after the barrier: the next checkpoint's
        assert kind.read() == []
        sink.commit(handle)
        assert kind.read() == ["a", "b", "c", "d"]
        sink.commit(barrier(sink, 2))
        assert kind.read() == ["a", "b", "c", "d", "e"]

    def test_committing_a_checkpoint_again_publishes_nothing_twice(self, kind: SinkKind) -> None:
        sink = kind.started()
        stage(sink, 0, ("a",), ("b",))
        handle = barrier(sink, 1)
        sink.commit(handle)
        sink.commit(handle)                 # the committer retried
        restarted = kind.new()
        restarted.recover(handle)           # a new process re-runs it from `_metadata`
        restarted.recover(handle)           # and that recovery crashed and ran again
        assert kind.read() == ["a", "b"]
        stage(restarted, 1, ("c",))
        restarted.commit(barrier(restarted, 2))
        assert kind.read() == ["a", "b", "c"]

    @pytest.mark.parametrize("order", ["in order", "later first"])
    def test_overlapping_checkpoints_publish_each_row_once(self, kind: SinkKind, order: str) -> None:
        sink = kind.started()
        stage(sink, 0, ("a",))
        first = barrier(sink, 1)
        stage(sink, 1, ("b",))
        second = barrier(sink, 2)  # before commit(first) ran: covers its rows too
        for handle in ([first, second] if order == "in order" else [second, first]):
            sink.commit(handle)
        assert kind.read() == ["a", "b"]

    def test_a_failed_checkpoints_rows_ride_with_the_next(self, kind: SinkKind) -> None:
        sink = kind.started()
        stage(sink, 0, ("a",))
        sink.abort(barrier(sink, 1))
        stage(sink, 1, ("b",))
        sink.commit(barrier(sink, 2))
        assert kind.read() == ["a", "b"]

    def test_a_crash_after_metadata_before_commit_is_committed_by_recover(self, kind: SinkKind) -> None:
        sink = kind.started()
        stage(sink, 0, ("a",))
        sink.commit(barrier(sink, 1))
        stage(sink, 1, ("b",), ("c",))
        handle = barrier(sink, 2)           # `_metadata` of 2 is written, then the process dies
        stage(sink, 2, ("d",))              # staged after the barrier, never checkpointed

        restarted = kind.new()
        restarted.recover(handle)
        assert kind.read() == ["a", "b", "c"]
        stage(restarted, 2, ("d",))         # the replay of epoch 2
        restarted.commit(barrier(restarted, 3))
        assert kind.read() == ["a", "b", "c", "d"]

    def test_a_checkpoint_that_never_completed_is_withdrawn_on_recover(self, kind: SinkKind) -> None:
        sink = kind.started()
        stage(sink, 0, ("a",))
        first = barrier(sink, 1)
        sink.commit(first)
        stage(sink, 1, ("b-first-run",))
        barrier(sink, 2)                    # pre-committed, but `_metadata` of 2 never written
        stage(sink, 2, ("c-first-run",))

        restarted = kind.new()
        restarted.recover(first)
        assert kind.read() == ["a"]
        stage(restarted, 1, ("b",))         # the replay, different this time (say)
        stage(restarted, 2, ("c",))
        restarted.commit(barrier(restarted, 3))
        assert kind.read() == ["a", "b", "c"]

    def test_a_restore_to_an_older_checkpoint_publishes_each_epoch_once(self, kind: SinkKind) -> None:
        sink = kind.started()
        stage(sink, 0, ("a",))
        first = barrier(sink, 1)
        sink.commit(first)
        stage(sink, 1, ("b",))
        stage(sink, 2, ("c",))
        sink.commit(barrier(sink, 2))
        assert kind.read() == ["a", "b", "c"]

        restarted = kind.new()
        restarted.recover(first)            # checkpoint 2 turned out unrestorable
        if restarted.needs_epoch_plans:
            # Published output cannot be withdrawn: the sink says how far it got, and the
            # runtime replays those epochs as first planned without handing them over again.
            assert kind.read() == ["a", "b", "c"]
            assert restarted.published_epoch() == 2
        else:
            assert kind.read() == ["a"]
            assert restarted.committed_epochs() == [0]
            stage(restarted, 1, ("b",))
            stage(restarted, 2, ("c",))
        stage(restarted, 3, ("d",))
        restarted.commit(barrier(restarted, 3))
        assert kind.read() == ["a", "b", "c", "d"]

    @pytest.mark.parametrize("damage", ["missing", "truncated", "same size, other bytes"])
    def test_a_restored_checkpoint_with_damaged_staged_output_fails_naming_it_and_publishes_nothing(
            self, kind: SinkKind, damage: str) -> None:
        sink = kind.started()
        stage(sink, 0, ("a",))
        stage(sink, 1, ("b",))
        handle = barrier(sink, 1)           # `_metadata` written, then the process dies
        storage, paths = kind.staged_files(handle)
        assert len(paths) == 2
        victim = paths[-1]
        data = storage.read_bytes(victim)
        if damage == "missing":
            storage.rm(victim)
        elif damage == "truncated":
            storage.write_atomic(victim, data[:-7])
        elif kind.verifies_content:
            middle = len(data) // 2
            storage.write_atomic(victim, data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
        else:
            pytest.skip(f"{kind.name} here checks the size of restored staged output only")
        with pytest.raises(CorruptCheckpointError, match=victim.rsplit("/", 1)[-1]):
            kind.new().recover(handle)
        assert kind.read() == []

        fallback = kind.started()           # the runtime falls back to starting afresh
        stage(fallback, 0, ("a",))
        stage(fallback, 1, ("b",))
        fallback.commit(barrier(fallback, 1))
        assert kind.read() == ["a", "b"]

    def test_a_task_attempt_that_died_after_staging_is_never_published(self, kind: SinkKind) -> None:
        sink = kind.started()
        if sink.epoch_writer() is None:
            pytest.skip(f"{kind.name} stages on the driver: no task attempts to lose")
        writer = AttemptDiesAfterStaging(cloudpickle.loads(cloudpickle.dumps(sink.epoch_writer())))
        handles = []
        for part, task in enumerate([("a", "b"), ("c",)]):
            with pytest.raises(ConnectionError):
                writer.write(0, part, rows(*task))
            handles += writer.write(0, part, rows(*task))   # Spark's retry
        sink.stage_epoch(0, json.loads(json.dumps(handles)))
        handle = barrier(sink, 1)
        sink.commit(handle)
        assert kind.read() == ["a", "b", "c"]
        kind.new().recover(handle)           # and a restart cleans up without publishing them
        assert kind.read() == ["a", "b", "c"]


def test_every_sink_of_the_package_is_under_contract() -> None:
    """A new exactly-once sink must be added to the `kind` fixture above."""
    import importlib
    import pkgutil

    import sparkpoint.connectors as connectors

    for module in pkgutil.iter_modules(connectors.__path__):
        importlib.import_module(f"{connectors.__name__}.{module.name}")

    def subclasses(cls: type) -> set[type]:
        return {c for sub in cls.__subclasses__() for c in {sub} | subclasses(sub)}

    found = {c.__name__ for c in subclasses(Sink) if c.__module__.startswith("sparkpoint.")}
    assert found == {"ParquetSink", "DeltaSink", "KafkaSink"}, f"sinks the contract does not run: {found}"
