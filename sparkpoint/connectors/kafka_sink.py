"""Write to a Kafka topic exactly once, bound to checkpoints.

Why staging, not an open transaction per checkpoint (as Flink's KafkaSink does):
a Kafka transaction cannot be resumed by another process with librdkafka (Flink
resumes one by setting the producer id and epoch through reflection). If the
records of a pre-committed checkpoint lived only in an open transaction, a crash
between `_metadata` and commit would lose them: the new run can only abort that
transaction. So the sink stages each epoch's rows durably (Arrow IPC files next to
the checkpoints, checksummed), and at commit time produces the checkpoint's rows in
ONE transaction that also moves a *commit marker*, atomically with the data: a
consumer-group offset (group `<transactional.id>.<generation>.commits`, partition 0
of the topic, offset = checkpoint id) committed with `send_offsets_to_transaction`.
Because the marker and the records become visible together, "is checkpoint N
published?" always has a true answer: marker >= N. The marker's metadata holds the last
epoch published (`{"epoch": n}`), so after a restore the sink can say how far its output
went (`published_epoch`).

A *generation* is one line of the sink's commits, with a marker of its own: it begins at
a fresh start and at a savepoint restore, and goes on through every failover to the
job's own checkpoints, whose ids are never reused in one checkpoint directory. A
savepoint restored into a new directory numbers its checkpoints from the savepoint's id
+ 1, ids the job that took the savepoint may already have published. Under that job's
marker they would count as published and be dropped; under a marker of their own they
cannot be confused with anything another run published.

One transactional id per (job, sink) is enough, so no pool: transactions are only
opened inside `commit`, one at a time, so concurrent pending checkpoints never need
concurrent transactions. A pre-committed checkpoint that is aborted (or never
completes) keeps its rows staged; the next handle lists them as an earlier
*segment*, so they are published by the next commit, once. The fixed id is what
fences a zombie: `init_transactions` by a new run aborts the old run's open
transaction and makes its producer fail.

Commit protocol (`commit(handle)`), and what a crash at each step leaves behind:

  1. Skip if marker >= checkpoint id (already published).
        crash: nothing happened.
  2. Check the staged files of every segment newer than the marker (name, presence,
     size); a missing or damaged one is a CorruptCheckpointError naming it, raised
     before any transaction opens, so a restore falls back to an older checkpoint.
        crash: nothing happened.
  3. begin transaction; produce the rows (each file's sha256 checked as it is read;
     a mismatch aborts the transaction); send the marker (offset = checkpoint id).
        crash: an open transaction, invisible to read_committed consumers;
        recover() fences it (init_transactions aborts it) and redoes 1-6.
  4. commit transaction: rows and marker become visible together.
        crash after: recover() finds marker >= id and skips to 5.
  5. Record the commit in `_committed.json` next to the staged files.
        crash after: recover() skips by the file; deletes the leftovers (6).
  6. Delete the staged files of the published segments.

`recover(handle)`: a new producer and init_transactions (fence + abort whatever a
crashed run left open), re-run `commit(handle)` under the handle's own transactional
id and generation (idempotent by the marker of the run that wrote the handle), then
go on in that generation (a failover to this job's own checkpoint) or start a new one
(a savepoint, or a handle staged in another directory), and delete every other staged
file: those epochs come after the restored barrier and are replayed. recover is where
a run takes (or, after a failover, takes back) the transactional id: a producer fenced
earlier is replaced and commits work again. The commit path itself never
re-initializes after a fencing, so a zombie cannot fence its successor from there (the
job lease stops the zombie). Errors that no restart can cure
(authorization, a transaction timeout above the brokers' maximum, brokers without
transactions) are raised as ConfigError, which the runtime does not retry.

Savepoints: the staged rows live with the job's checkpoints, but a savepoint is
self-contained and relocatable, and a new job may start from it with another checkpoint
directory after the job that took it was cancelled and its directory deleted. So the
handle of a savepoint (`savepoint_handle`) comes with copies of the staged files of
every unpublished segment in `<savepoint>/sinks/<name>/`, named relative to the
savepoint. `recover` of a job started from it (`use_savepoint`) copies those it still
has to publish into its own staging directory first; the savepoint itself is never
written to or deleted from by the new job.

Threads: `write_epoch`/`pre_commit` run on the epoch loop, `commit` on the committer
thread; the sealed segments they share are guarded by a lock.

Delivery: exactly-once for read_committed consumers. Records appear at checkpoint
completion, not per epoch (end-to-end latency >= checkpoint interval). A failover to
a checkpoint older than one already published (the newer checkpoints damaged or lost)
replays the epochs in between exactly as first planned, from the job's epoch plan log,
and does not hand their rows to the sink again (runtime/epoch_replay.py). A savepoint
restored while the job that took it went on publishing starts a new generation: the
records that job published after the savepoint are published again; this is logged.

`mode="at_least_once"`: a plain idempotent producer sends each epoch at once;
`pre_commit` flushes and fails the checkpoint if any record was not acknowledged.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Mapping

import pyarrow as pa
import pyarrow.ipc as ipc

from sparkpoint.connectors.base import Sink
from sparkpoint.connectors.kafka_common import consumer_config, producer_config
from sparkpoint.errors import ConfigError, CorruptCheckpointError, KafkaConnectorError
from sparkpoint.storage.fs import StorageFS

log = logging.getLogger(__name__)

DeliveryMode = Literal["exactly_once", "at_least_once"]
HANDLE_VERSION = 1
_COMMITTED_FILE = "_committed.json"
# Generations whose last commit `_committed.json` keeps (a restore of an older run's
# checkpoint still finds its record when that run's marker group has expired).
_RECORDED_GENERATIONS = 32
_STAGED_SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary())])
# The only names `write_epoch` creates. Names read back from a checkpoint handle must
# match: no '/', no '..', so nothing outside the staging directory is read or deleted.
_STAGED_NAME = re.compile(r"epoch-\d{1,19}-[0-9a-f]{8}\.arrow")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Where a savepoint keeps its copies of the staged files, relative to the savepoint.
_SAVEPOINT_STAGED_KEY = "savepoint_staged"
_SAVEPOINT_STAGED_DIR = "sinks"
# send_offsets_to_transaction gets its timeout plus this before it is abandoned.
_MARKER_GRACE_S = 5.0
# Abandoned marker calls (each holding a producer and a thread) tolerated at once; past
# this no new producer is started until one of them returns.
_MAX_STUCK_MARKERS = 2


@dataclass(frozen=True)
class StagedFile:
    name: str
    rows: int
    sha256: str
    size: int = -1  # bytes; -1 in handles of older runs (not recorded)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rows": self.rows, "sha256": self.sha256, "size": self.size}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "StagedFile":
        name = d.get("name") if isinstance(d, Mapping) else None
        if not isinstance(name, str) or not _STAGED_NAME.fullmatch(name):
            raise CorruptCheckpointError(
                f"Kafka sink handle: staged file name {name!r} is not one the sink writes "
                "(epoch-<epoch>-<hex8>.arrow, inside the staging directory); the checkpoint's "
                "_metadata was altered or damaged, so nothing is read or deleted for it")
        sha256, rows, size = d.get("sha256"), d.get("rows"), d.get("size", -1)
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256) or not _is_int(rows) \
                or not _is_int(size):
            raise CorruptCheckpointError(f"Kafka sink handle: staged file entry {dict(d)!r:.300} "
                                         "lacks a valid sha256, rows or size")
        return cls(name, rows, sha256, size)


@dataclass(frozen=True)
class Segment:
    """The rows staged between two barriers, sealed by checkpoint `checkpoint_id`."""

    checkpoint_id: int
    files: tuple[StagedFile, ...]

    # Not "files": in a handle that key lists checkpoint-owned files with job-relative
    # paths (storage/handles.py), which the checkpoint store deletes and verifies.
    def to_json(self) -> dict[str, Any]:
        return {"checkpoint_id": self.checkpoint_id, "staged": [f.to_json() for f in self.files]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Segment":
        try:
            staged = d["staged"] if "staged" in d else d["files"]   # "files": handles of older runs
            checkpoint_id = int(d["checkpoint_id"])
            entries = list(staged)
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptCheckpointError(f"Kafka sink handle: segment {d!r:.300} is malformed "
                                         f"({type(e).__name__}: {e})") from None
        return cls(checkpoint_id, tuple(StagedFile.from_json(f) for f in entries))


class KafkaSink(Sink):
    read_hint = "read_committed consumers see committed output only"
    """Rows of `value_column` (and `key_column`, if given; string or binary) to `topic`.

    staging_dir: a durable directory or URL (fsspec) that every run of the job sees,
    e.g. next to the checkpoint directory; needed for exactly_once.
    client_config: librdkafka settings passed through (security, timeouts, ...).
    """

    name = "kafka"

    def __init__(self, bootstrap_servers: str, topic: str, *, value_column: str = "value",
                 key_column: str | None = None, mode: DeliveryMode = "exactly_once",
                 transactional_id_prefix: str = "sparkpoint", staging_dir: str | None = None,
                 staging_options: Mapping[str, Any] | None = None,
                 client_config: Mapping[str, Any] | None = None,
                 transaction_timeout_s: float = 60.0, name: str = "kafka"):
        if mode not in ("exactly_once", "at_least_once"):
            raise ConfigError(f"KafkaSink mode={mode!r}; accepted: 'exactly_once', 'at_least_once'")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.value_column = value_column
        self.key_column = key_column
        self.mode = mode
        self.transactional_id_prefix = transactional_id_prefix
        self.name = name
        # None: the runtime puts staging beside the job's checkpoints before open().
        self.staging_dir = staging_dir
        self.staging_options = dict(staging_options or {})
        self._client_config = dict(client_config or {})
        self._timeout_s = transaction_timeout_s
        self._job_name: str | None = None
        self._fs: StorageFS | None = None
        self._dir = ""
        self._producer: Any = None
        self._marker_consumer: Any = None
        self._generation: str | None = None
        self._last_committed = 0
        # Checkpoints up to this id are published: the one recover() settled (by an
        # earlier generation); this generation's marker knows nothing of it.
        self._settled = 0
        # `_committed.json` as last read or written: generation -> checkpoint id.
        self._recorded: dict[str, int] | None = None
        self._recorded_epochs: dict[str, int] = {}  # ... and generation -> published epoch
        # The last epoch whose rows this generation published (the marker's metadata says
        # it, atomically with the rows); epochs up to it that run again after a restore
        # are replayed as first planned and not published twice. None: none known.
        self._published_epoch: int | None = None
        self._epoch = -1  # the last epoch write_epoch saw: a barrier after it seals up to it
        self._open_files: list[StagedFile] = []   # staged since the last barrier (epoch loop only)
        # Pre-committed, not yet published: appended by the epoch loop (pre_commit),
        # pruned by the committer thread (commit); always under _lock.
        self._sealed: list[Segment] = []
        self._lock = threading.Lock()
        self._delivery_errors: list[str] = []
        self._outcome_unknown = False             # a publish failed midway; see _resync
        self._fenced = False                      # a newer run took over our transactional id
        # Marker calls abandoned past their time-out: (thread, the producer it holds).
        self._stuck: list[tuple[threading.Thread, Any]] = []
        # The savepoint this job starts from (url, storage options), if any.
        self._savepoint: tuple[str, dict[str, Any]] | None = None

    # -- identity -----------------------------------------------------------------------
    @property
    def transactional_id(self) -> str:
        return f"{self.transactional_id_prefix}.{self._require_job()}.{self.name}"

    @property
    def last_committed_checkpoint(self) -> int:
        return self._last_committed

    @property
    def location(self) -> str | None:
        return f"kafka topic {self.topic}"

    @property
    def needs_epoch_plans(self) -> bool:
        # A committed transaction cannot be withdrawn; at-least-once may repeat anyway.
        return self.mode == "exactly_once"

    def published_epoch(self) -> int | None:
        return self._published_epoch if self.mode == "exactly_once" else None

    def use_job_storage(self, staging_dir: str, options: Mapping[str, Any]) -> None:
        if self.staging_dir is None:  # an explicit staging_dir wins
            self.staging_dir = staging_dir
            self.staging_options = self.staging_options or dict(options)

    def use_savepoint(self, savepoint_url: str, options: Mapping[str, Any]) -> None:
        self._savepoint = (savepoint_url, dict(options))

    def open(self, job_name: str) -> None:
        self._job_name = job_name
        if self.mode == "exactly_once":
            if not self.staging_dir:
                raise ConfigError("KafkaSink(mode='exactly_once') needs staging_dir: a durable "
                                  "directory or URL every run of the job can read (the runtime "
                                  "uses <checkpoint dir>/<job>/sinks/<name> by default), where rows "
                                  "wait for their checkpoint")
            self._fs = StorageFS.from_url(self.staging_dir, self.staging_options)
            self._dir = f"{self._fs.root}/{job_name}/{self.name}"
            self._fs.makedirs(self._dir)
        self._check_topic_exists()

    def _check_topic_exists(self, timeout_s: float = 10.0) -> None:
        """A missing output topic is a configuration error: say so once at start instead
        of failing over on every commit. An unreachable cluster is not judged here (the
        commits retry); only a definite 'unknown topic' answer refuses to start."""
        from confluent_kafka import KafkaError, KafkaException, Producer

        producer = Producer(producer_config(self.bootstrap_servers, self._client_config))
        try:
            metadata = producer.list_topics(topic=self.topic, timeout=timeout_s)
        except KafkaException:
            return
        topic = metadata.topics.get(self.topic)
        if topic is not None and topic.error is not None and \
                topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise ConfigError(f"KafkaSink {self.name!r}: output topic {self.topic!r} does not exist on "
                              f"{self.bootstrap_servers}; create it (e.g. kafka-topics.sh --create --topic "
                              f"{self.topic}) or point the sink at an existing topic")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self._timeout_s)
            self._producer = None
        self._close_marker_consumer()
        self._reap_stuck()
        if self._stuck:
            log.warning("Kafka sink %s: %d commit-marker calls are still blocked in librdkafka "
                        "(#5456); their daemon threads and producers end with the process",
                        self.name, len(self._stuck))

    def _close_marker_consumer(self) -> None:
        if self._marker_consumer is not None:
            consumer, self._marker_consumer = self._marker_consumer, None
            try:
                consumer.close()
            except Exception as e:  # already closed, or the broker is away: nothing to keep
                log.debug("Kafka sink %s: closing the marker consumer: %s", self.name, e)

    # -- the two-phase commit -----------------------------------------------------------
    def recover(self, handle: Mapping[str, Any] | None) -> None:
        if self.mode == "at_least_once":
            self._producer = self._make_producer(transactional=False)
            return
        fs = self._require_fs()
        if handle is not None and (handle.get("version") != HANDLE_VERSION
                                   or handle.get("mode") != self.mode):
            raise ConfigError(
                f"Kafka sink {self.name}: the restored checkpoint holds a handle of version "
                f"{handle.get('version')} in mode {handle.get('mode')!r}, but this sink is "
                f"version {HANDLE_VERSION} in mode {self.mode!r}; restore with the same sink "
                "settings, or start from an empty state")
        if handle is not None:  # refuse a damaged or crafted handle before touching anything
            for s in handle.get("segments") or []:
                Segment.from_json(s)
        with self._lock:
            self._open_files, self._sealed, self._last_committed = [], [], 0
        self._settled, self._recorded, self._recorded_epochs = 0, None, {}
        self._published_epoch, self._epoch = None, -1
        savepoint, self._savepoint = self._savepoint, None   # used for this recover only
        written_by = handle.get("transactional_id") if handle is not None else None
        written_by = written_by if isinstance(written_by, str) and written_by else self.transactional_id
        if handle is not None:
            # First the restored checkpoint, judged by the marker of the run that wrote
            # it (possibly under another job name, so its transactional id).
            self._enter_generation(written_by, str(handle["generation"]))
        else:
            self._enter_generation(self.transactional_id, uuid.uuid4().hex[:12])
        # This run (re)takes the transactional id: a producer fenced before (by a run that
        # the job lease has since stopped, or a fatal producer error) is replaced, and
        # init_transactions fences every producer of a crashed or zombie run and aborts
        # its open transaction, before we read the marker.
        self._resync()
        self._fenced = False
        if handle is not None:
            restored = int(handle["checkpoint_id"])
            # A failover to this job's own checkpoint goes on in the same generation: ids
            # are never reused in one checkpoint directory, and its marker keeps knowing
            # what was published past the restored checkpoint. A savepoint, or a handle
            # staged in another directory (another checkpoint directory), starts a new one.
            own = (savepoint is None and written_by == self.transactional_id
                   and _SAVEPOINT_STAGED_KEY not in handle and handle.get("staging", self._dir) == self._dir)
            if self._last_committed > restored:
                if own and self._published_epoch is not None:
                    log.warning(
                        "Kafka sink %s: restoring checkpoint %d, but checkpoints up to %d were already "
                        "published to %s (newer checkpoints damaged or lost); the epochs up to %d run "
                        "again as first planned and are not published again",
                        self.name, restored, self._last_committed, self.topic, self._published_epoch)
                else:
                    log.warning(
                        "Kafka sink %s: restoring %s %d, but the run that wrote it went on to publish "
                        "up to checkpoint %d to %s; the records in between are published again",
                        self.name, "savepoint" if savepoint is not None else "checkpoint", restored,
                        self._last_committed, self.topic)
            self._fetch_from_savepoint(handle, savepoint)
            self.commit(handle)
            if not own:
                # A generation of this run: the ids to come may have been used, and
                # published, by the run that wrote the handle (a savepoint restored into a
                # new checkpoint directory counts on from its id), so its marker must not
                # judge them; and what it published after the savepoint is published again.
                self._enter_generation(self.transactional_id, uuid.uuid4().hex[:12])
                self._settled = self._last_committed = restored
                self._published_epoch = None
        for name in fs.ls(self._dir):
            if name.startswith("epoch-"):
                fs.rm(f"{self._dir}/{name}")

    def write_epoch(self, epoch: int, rows: pa.Table) -> None:
        keys, values = self._key_values(rows)
        if self.mode == "at_least_once":
            if self._producer is None:
                self._producer = self._make_producer(transactional=False)
            self._produce_all(keys, values, on_delivery=self._on_delivery)
            return
        self._require_recovered()
        self._epoch = epoch
        if len(values) == 0:
            return
        table = pa.Table.from_arrays([keys, values], schema=_STAGED_SCHEMA)
        sink = io.BytesIO()
        with ipc.new_stream(sink, _STAGED_SCHEMA) as writer:
            writer.write_table(table)
        data = sink.getvalue()
        # The random part keeps a replayed epoch from overwriting a crashed run's file.
        staged = StagedFile(f"epoch-{epoch:012d}-{uuid.uuid4().hex[:8]}.arrow", len(values),
                            hashlib.sha256(data).hexdigest(), len(data))
        self._require_fs().write_atomic(self._staged_path(staged.name), data)
        self._open_files.append(staged)

    def pre_commit(self, checkpoint_id: int) -> Mapping[str, Any]:
        if self.mode == "at_least_once":
            self._flush_or_raise()
            return {"version": HANDLE_VERSION, "mode": self.mode, "checkpoint_id": checkpoint_id}
        self._require_recovered()
        with self._lock:  # the committer thread prunes _sealed concurrently
            self._sealed.append(Segment(checkpoint_id, tuple(self._open_files)))
            segments = [s.to_json() for s in self._sealed]
        self._open_files = []
        return {
            "version": HANDLE_VERSION,
            "mode": self.mode,
            "checkpoint_id": checkpoint_id,
            "transactional_id": self.transactional_id,
            "generation": self._generation,
            "topic": self.topic,
            # The epoch the barrier followed: its commit publishes every epoch up to it.
            "epoch": self._epoch,
            "staging": self._dir,
            # Every sealed segment not yet published: a checkpoint that failed or is
            # still pending is covered by this one too, so no abort can lose rows.
            "segments": segments,
        }

    def savepoint_handle(self, handle: Mapping[str, Any], savepoint_url: str,
                         options: Mapping[str, Any]) -> Mapping[str, Any]:
        """Copy the staged files of the handle's unpublished segments into the savepoint
        (checked against the handle as they are read) and name the copies relative to it.
        A file the committer thread deleted meanwhile was published: not needed."""
        if self.mode == "at_least_once":
            return handle
        fs = self._require_fs()
        relative = f"{_SAVEPOINT_STAGED_DIR}/{self.name}"
        dest = StorageFS.from_url(savepoint_url, dict(options))
        dest_dir = f"{dest.root.rstrip('/')}/{relative}"
        dest.makedirs(dest_dir)
        for segment in (Segment.from_json(s) for s in handle["segments"]):
            for staged in segment.files:
                try:
                    data = self._read_staged_bytes(staged)
                except CorruptCheckpointError:
                    if segment.checkpoint_id <= self._last_committed:
                        continue
                    raise
                dest.write_atomic(f"{dest_dir}/{staged.name}", data)
        return {**handle, _SAVEPOINT_STAGED_KEY: relative}

    def _fetch_from_savepoint(self, handle: Mapping[str, Any],
                              savepoint: tuple[str, dict[str, Any]] | None) -> None:
        """Copy the savepoint's copies of the files still to publish into this run's
        staging directory (the job that took the savepoint may be gone, with its own)."""
        relative = handle.get(_SAVEPOINT_STAGED_KEY)
        if relative is None or savepoint is None:
            return
        parts = relative.split("/") if isinstance(relative, str) else []
        if len(parts) != 2 or parts[0] != _SAVEPOINT_STAGED_DIR or parts[1] in ("", ".", "..") \
                or "\\" in relative:
            raise CorruptCheckpointError(
                f"Kafka sink handle: {_SAVEPOINT_STAGED_KEY}={relative!r:.100} is not a directory the "
                f"sink writes in a savepoint ({_SAVEPOINT_STAGED_DIR}/<sink name>); the savepoint's "
                "_metadata was altered or damaged, so nothing is read from it")
        url, options = savepoint
        src = StorageFS.from_url(url, options)
        src_dir = f"{src.root.rstrip('/')}/{relative}"
        fs = self._require_fs()
        for s in handle.get("segments") or []:
            segment = Segment.from_json(s)
            if segment.checkpoint_id <= self._last_committed:
                continue
            for staged in segment.files:
                to = self._staged_path(staged.name)
                if fs.exists(to):
                    continue
                path = f"{src_dir}/{staged.name}"
                try:
                    data = src.read_bytes(path)
                except FileNotFoundError:
                    raise CorruptCheckpointError(
                        f"Kafka sink {self.name}: staged file {path} of the savepoint is missing; the "
                        "rows of its unpublished checkpoint cannot be published. Copy the savepoint "
                        "directory whole, or start from another savepoint") from None
                fs.write_atomic(to, data)

    def commit(self, handle: Mapping[str, Any]) -> None:
        if self.mode == "at_least_once":
            return
        self._require_recovered()
        checkpoint_id = int(handle["checkpoint_id"])
        if self._fenced:
            raise KafkaConnectorError(
                f"Kafka sink {self.name}: this run was fenced by a newer run of job "
                f"{self._job_name!r} (same transactional id {self.transactional_id}); commits stay "
                "refused until the job fails over and recover() starts a new producer")
        segments = [Segment.from_json(s) for s in handle["segments"]]   # validates names
        if self._outcome_unknown or self._producer is None:
            self._resync()
        # 1. already published?
        if checkpoint_id <= self._last_committed:
            self._forget_published(checkpoint_id)
            return
        # 2. staged rows of every segment the marker does not cover yet
        todo = [s for s in segments if s.checkpoint_id > self._last_committed]
        if not self._all_staged(todo):
            # A successor run may have published them and cleaned up: ask the marker
            # (a read; unlike init_transactions it never fences that successor).
            self._last_committed = max(self._last_committed, self._read_last_committed())
            if checkpoint_id <= self._last_committed:
                self._forget_published(checkpoint_id)
                return
            todo = [s for s in segments if s.checkpoint_id > self._last_committed]
        files = [f for s in todo for f in s.files]
        self._verify_staged(files)
        # 3.-4. one transaction: rows + marker
        epoch = handle.get("epoch")
        epoch = max(epoch if _is_int(epoch) else -1, -1 if self._published_epoch is None else self._published_epoch)
        self._outcome_unknown = True
        self._publish(checkpoint_id, files, epoch if epoch >= 0 else None)
        self._outcome_unknown = False
        self._last_committed = checkpoint_id
        if epoch >= 0:
            self._published_epoch = epoch
        # 5. durable record of the commit
        self._record_commit(checkpoint_id)
        # 6. the published rows are no longer needed
        for s in segments:
            for f in s.files:
                self._require_fs().rm(self._staged_path(f.name))
        self._forget_published(checkpoint_id)

    def abort(self, handle: Mapping[str, Any]) -> None:
        """Nothing to undo: the aborted checkpoint's segment stays sealed and is part of
        the next handle, so its rows are published by the next completed checkpoint."""

    # -- steps ---------------------------------------------------------------------------
    def _resync(self) -> None:
        """Start a fresh transactional producer and re-read the marker. After a publish
        that failed midway nobody knows whether its commit reached the broker;
        init_transactions waits for a commit in flight or aborts the transaction, so
        the marker read after it is the truth."""
        from confluent_kafka import KafkaException

        self._reap_stuck()
        if len(self._stuck) >= _MAX_STUCK_MARKERS:
            raise KafkaConnectorError(
                f"Kafka sink {self.name}: {len(self._stuck)} earlier commit markers for {self.topic} "
                "are still blocked inside librdkafka (send_offsets_to_transaction ignores its "
                "timeout while the group coordinator is away, librdkafka #5456/#5511); no further "
                "producer is started until one returns, so none leaks. The rows stay staged and "
                "are published by a later commit")
        if self._producer is not None:
            self._producer.purge()
            self._producer = None
        producer = self._make_producer(transactional=True)
        try:
            producer.init_transactions(self._timeout_s)
        except KafkaException as e:
            raise self._kafka_error(e.args[0], "initializing transactions") from e
        self._producer = producer
        self._last_committed = self._read_last_committed()
        self._outcome_unknown = False

    def _kafka_error(self, error: Any, doing: str) -> Exception:
        """ConfigError (the runtime does not retry it) for a refusal no restart can cure,
        else a KafkaConnectorError (fail over and retry)."""
        hint = _permanent_error_hint(error, self)
        if hint is not None:
            return ConfigError(
                f"Kafka sink {self.name}: {doing} for {self.transactional_id} on {self.bootstrap_servers} "
                f"failed with {error.name()} ({error.str()}); this does not go away by restarting: {hint}")
        return KafkaConnectorError(f"Kafka sink {self.name}: {doing} for {self.transactional_id} "
                                   f"failed: {error}")

    def _publish(self, checkpoint_id: int, files: list[StagedFile], epoch: int | None) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        producer = self._producer
        try:
            producer.begin_transaction()
            for staged in files:  # one file in memory at a time
                table = self._read_staged(staged)
                self._produce_all(table.column("key"), table.column("value"))
            # The marker's metadata carries the last published epoch, atomically with the rows.
            self._send_marker(producer, [TopicPartition(self.topic, 0, checkpoint_id,
                                                        metadata=_marker_metadata(epoch))])
            producer.commit_transaction(self._timeout_s)
        except CorruptCheckpointError:
            # A staged file failed its checksum midway: nothing of it may become visible.
            try:
                producer.abort_transaction(self._timeout_s)
                self._outcome_unknown = False
            except KafkaException as e:  # the next use starts a new producer (_resync)
                log.warning("Kafka sink %s: aborting the transaction failed: %s", self.name, e)
            raise
        except KafkaException as e:
            error = e.args[0]
            if _permanent_error_hint(error, self) is not None:
                raise self._kafka_error(error, f"publishing checkpoint {checkpoint_id}") from e
            if error.fatal():
                # Never re-init here: init_transactions would fence the newer run. Only
                # recover() (the failover) starts a new producer.
                self._fenced = True
                raise KafkaConnectorError(
                    f"Kafka sink {self.name}: the producer for {self.transactional_id} was fenced "
                    "or failed fatally (another run of this job took over the transactional id, "
                    f"or the broker rejected the transaction: {error}); this sink refuses commits "
                    "until the job fails over and recover() starts a new producer") from e
            raise KafkaConnectorError(
                f"Kafka sink {self.name}: publishing checkpoint {checkpoint_id} to "
                f"{self.topic} failed: {error}; the checkpoint's rows stay staged and are "
                "published by the next commit or on recovery") from e

    def _send_marker(self, producer: Any, marker: list[Any]) -> None:
        """send_offsets_to_transaction with a timeout that holds. librdkafka can block in
        it forever once the group coordinator went away, e.g. a broker restart
        (librdkafka #5456, #5511), so it runs on a helper thread; past the timeout the
        producer is abandoned to that thread, and the next commit's `_resync` fences its
        open transaction with a fresh producer."""
        outcome: list[BaseException | None] = []
        metadata = self._marker_consumer.consumer_group_metadata()

        def send() -> None:
            try:
                producer.send_offsets_to_transaction(marker, metadata, self._timeout_s)
                outcome.append(None)
            except BaseException as e:  # handed to the committing thread below
                outcome.append(e)

        worker = threading.Thread(target=send, daemon=True, name=f"kafka-sink-marker-{self.name}")
        worker.start()
        worker.join(self._timeout_s + _MARKER_GRACE_S)
        if not outcome:
            # Kept, not forgotten: _resync reaps it once the call returns and starts no
            # further producer while _MAX_STUCK_MARKERS of them are blocked.
            self._stuck.append((worker, producer))
            self._producer = None
            raise KafkaConnectorError(
                f"Kafka sink {self.name}: the broker did not accept the commit marker of "
                f"{self.topic} within {self._timeout_s:.0f}s; the rows stay staged and are "
                "published by the next commit with a new producer")
        if outcome[0] is not None:
            raise outcome[0]

    def _read_last_committed(self) -> int:
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        # A group coordinator that is moving or loading answers for a moment with errors
        # worth waiting out here rather than failing the whole recover.
        transient = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                     KafkaError.COORDINATOR_LOAD_IN_PROGRESS}
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                found = self._marker_consumer.committed([TopicPartition(self.topic, 0)],
                                                        timeout=self._timeout_s)[0]
                marker = found.offset
                break
            except KafkaException as e:
                error = e.args[0]
                if error.code() not in transient or time.monotonic() > deadline:
                    raise self._kafka_error(error, "reading the commit marker") from e
                time.sleep(0.2)
        recorded = self._recorded_commit()
        epochs = [e for e in (_marker_epoch(found.metadata) if marker >= 0 else None,
                              self._recorded_epochs.get(str(self._generation)), self._published_epoch)
                  if e is not None]
        self._published_epoch = max(epochs) if epochs else None
        return max(self._settled, recorded, marker if marker >= 0 else 0)

    def _recorded_commit(self) -> int:
        """The checkpoint `_committed.json` records for this generation, 0 if none."""
        return self._read_record().get(str(self._generation), 0)

    def _read_record(self) -> dict[str, int]:
        """`_committed.json`: the last published checkpoint of each recent generation.
        An unreadable record is ignored with a warning (the marker is the truth; the
        record only helps when a marker group's offsets expired): failing here would
        fail every recover of the job."""
        if self._recorded is not None:
            return self._recorded
        path = f"{self._dir}/{_COMMITTED_FILE}"
        fs = self._require_fs()
        self._recorded = {}
        try:
            data = json.loads(fs.read_bytes(path))
            # {"generation", "checkpoint_id"}: the current one; "commits": every recent one
            commits = dict(data.get("commits") or {})
            commits.setdefault(str(data["generation"]), data["checkpoint_id"])
            self._recorded = {str(g): int(c) for g, c in commits.items()}
            self._recorded_epochs = {str(g): int(e) for g, e in dict(data.get("epochs") or {}).items()}
        except FileNotFoundError:
            pass
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            log.warning("Kafka sink %s: %s is unreadable (%s); ignoring it, the commit marker "
                        "in Kafka decides what was published", self.name, path, e)
        return self._recorded

    def _record_commit(self, checkpoint_id: int) -> None:
        commits = dict(self._read_record())
        commits.pop(str(self._generation), None)   # the newest generation goes last
        commits[str(self._generation)] = checkpoint_id
        commits = dict(list(commits.items())[-_RECORDED_GENERATIONS:])
        epochs = {g: e for g, e in self._recorded_epochs.items() if g in commits and g != str(self._generation)}
        if self._published_epoch is not None:
            epochs[str(self._generation)] = self._published_epoch
        self._require_fs().write_atomic(
            f"{self._dir}/{_COMMITTED_FILE}",
            json.dumps({"generation": self._generation, "checkpoint_id": checkpoint_id,
                        "commits": commits, "epochs": epochs}).encode())
        self._recorded, self._recorded_epochs = commits, epochs

    def _staged_path(self, name: str) -> str:
        """The staging path of a staged file; refuses names that could leave the directory."""
        if not _STAGED_NAME.fullmatch(name):
            raise CorruptCheckpointError(f"Kafka sink {self.name}: staged file name {name!r} is not "
                                         f"one the sink writes; refusing to use it under {self._dir}")
        return f"{self._dir}/{name}"

    def _all_staged(self, segments: list[Segment]) -> bool:
        fs = self._require_fs()
        return all(fs.exists(self._staged_path(f.name)) for s in segments for f in s.files)

    def _corrupt(self, path: str, why: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(
            f"Kafka sink {self.name}: staged file {path} of an unpublished checkpoint {why}; its "
            "rows cannot be published from this checkpoint. Restore falls back to an older one "
            "(the source replays from there); check what removed or changed the staging directory")

    def _verify_staged(self, files: list[StagedFile]) -> None:
        """Step 2: every file there with its recorded size, before a transaction opens."""
        fs = self._require_fs()
        for staged in files:
            path = self._staged_path(staged.name)
            try:
                size = fs.size(path)
            except FileNotFoundError:
                raise self._corrupt(path, "is missing") from None
            if staged.size >= 0 and size != staged.size:
                raise self._corrupt(path, f"has {size} bytes, the checkpoint recorded {staged.size}")

    def _read_staged_bytes(self, staged: StagedFile) -> bytes:
        path = self._staged_path(staged.name)
        try:
            data = self._require_fs().read_bytes(path)
        except FileNotFoundError:
            raise self._corrupt(path, "is missing") from None
        if staged.size >= 0 and len(data) != staged.size:
            raise self._corrupt(path, f"has {len(data)} bytes, the checkpoint recorded {staged.size}")
        if hashlib.sha256(data).hexdigest() != staged.sha256:
            raise self._corrupt(path, "fails its sha256 check (damaged or overwritten)")
        return data

    def _read_staged(self, staged: StagedFile) -> pa.Table:
        path = self._staged_path(staged.name)
        data = self._read_staged_bytes(staged)
        try:
            return ipc.open_stream(data).read_all()
        except pa.ArrowException as e:
            raise self._corrupt(path, f"is not an Arrow stream ({e})") from None

    def _forget_published(self, checkpoint_id: int) -> None:
        with self._lock:  # pre_commit appends concurrently on the epoch loop
            self._sealed = [s for s in self._sealed if s.checkpoint_id > checkpoint_id]

    def _reap_stuck(self) -> None:
        """Drop abandoned marker calls that have returned, with their producers."""
        self._stuck = [(t, p) for t, p in self._stuck if t.is_alive()]

    # -- producing -----------------------------------------------------------------------
    def _produce_all(self, keys: pa.ChunkedArray | pa.Array, values: pa.ChunkedArray | pa.Array,
                     on_delivery: Any = None) -> None:
        producer = self._producer
        extra = {"on_delivery": on_delivery} if on_delivery else {}
        for key, value in zip(keys.to_pylist(), values.to_pylist()):
            while True:
                try:
                    producer.produce(self.topic, value=value, key=key, **extra)
                    break
                except BufferError:  # local queue full: let deliveries drain, then retry
                    producer.poll(0.05)
        producer.poll(0)

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._delivery_errors.append(str(err))

    def _flush_or_raise(self) -> None:
        remaining = self._producer.flush(self._timeout_s)
        errors, self._delivery_errors = self._delivery_errors, []
        if remaining or errors:
            raise KafkaConnectorError(
                f"Kafka sink {self.name}: {remaining} records unsent and {len(errors)} failed "
                f"for {self.topic} (first error: {errors[:1]}); the checkpoint fails and the "
                "epochs are replayed")

    def _key_values(self, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
        values = _as_binary(rows, self.value_column)
        keys = (_as_binary(rows, self.key_column) if self.key_column
                else pa.nulls(len(values), pa.binary()))
        return keys, values

    def _make_producer(self, transactional: bool) -> Any:
        from confluent_kafka import Producer

        fixed: dict[str, Any] = {"enable_idempotence": True}
        if transactional:
            fixed["transactional_id"] = self.transactional_id
            fixed["transaction_timeout_ms"] = int(self._timeout_s * 1000)
        return Producer(producer_config(self.bootstrap_servers, self._client_config, **fixed))

    def _enter_generation(self, transactional_id: str, generation: str) -> None:
        """Judge and move the commit marker of `generation` from now on."""
        self._generation = generation
        self._close_marker_consumer()
        self._marker_consumer = self._make_marker_consumer(f"{transactional_id}.{generation}.commits")

    def _make_marker_consumer(self, group: str) -> Any:
        from confluent_kafka import Consumer

        return Consumer(consumer_config(self.bootstrap_servers, self._client_config,
                                        group_id=group, enable_auto_commit=False))

    def _require_job(self) -> str:
        if self._job_name is None:
            raise KafkaConnectorError(f"Kafka sink {self.name}: call open(job_name) first")
        return self._job_name

    def _require_fs(self) -> StorageFS:
        if self._fs is None:
            raise KafkaConnectorError(f"Kafka sink {self.name}: call open(job_name) first")
        return self._fs

    def _require_recovered(self) -> None:
        if self._generation is None:
            raise KafkaConnectorError(
                f"Kafka sink {self.name}: call recover(handle or None) before writing; "
                "recover publishes or discards what a previous run left staged")


def _marker_metadata(epoch: int | None) -> str:
    return json.dumps({"epoch": epoch}) if epoch is not None else ""


def _marker_epoch(metadata: Any) -> int | None:
    """The published epoch in a marker's metadata; None for markers of older runs (none)."""
    try:
        epoch = json.loads(metadata).get("epoch") if metadata else None
    except (ValueError, AttributeError):
        return None
    return epoch if _is_int(epoch) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _permanent_error_hint(error: Any, sink: KafkaSink) -> str | None:
    """What to change when `error` (a KafkaError) cannot be cured by retrying, else None."""
    from confluent_kafka import KafkaError

    code = error.code()
    auth = "grant this client's principal (client_config) "
    hints = {
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            auth + f"Write and Describe on the transactional id {sink.transactional_id}",
        KafkaError.CLUSTER_AUTHORIZATION_FAILED: auth + "IdempotentWrite on the cluster",
        KafkaError.TOPIC_AUTHORIZATION_FAILED: auth + f"Write and Describe on topic {sink.topic}",
        KafkaError.GROUP_AUTHORIZATION_FAILED:
            auth + f"Read and Describe on the consumer groups {sink.transactional_id}.*",
        KafkaError.INVALID_TRANSACTION_TIMEOUT:
            f"transaction_timeout_s={sink._timeout_s:g} exceeds the brokers' "
            "transaction.max.timeout.ms; lower transaction_timeout_s or raise that broker setting",
        KafkaError.UNSUPPORTED_VERSION: "the brokers do not support transactions (Kafka >= 2.5 needed)",
        KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT:
            "the topic's message format does not support transactions (message.format.version >= 0.11)",
        KafkaError._UNSUPPORTED_FEATURE: "the brokers do not support transactions (Kafka >= 2.5 needed)",
        KafkaError.SASL_AUTHENTICATION_FAILED: "check the credentials in client_config",
        KafkaError._AUTHENTICATION: "check the credentials and certificates in client_config",
        KafkaError._INVALID_ARG: "check the client settings in client_config",
    }
    return hints.get(code)


def _as_binary(rows: pa.Table, column: str) -> pa.ChunkedArray:
    if column not in rows.column_names:
        raise ConfigError(f"Kafka sink: column {column!r} is not in the output "
                          f"(columns: {rows.column_names})")
    col = rows.column(column)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return col.cast(pa.binary())
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        return col.cast(pa.binary())
    raise ConfigError(f"Kafka sink: column {column!r} is {col.type}; it must be string or "
                      "binary. Serialize it first, e.g. F.to_json(F.struct(...))")
