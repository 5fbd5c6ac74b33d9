"""Read Kafka topics exactly once, in bounded slices, in parallel on Spark.

Positions live in sparkpoint's checkpoints, not in Kafka: each split
("topic:partition") has the next offset to read. An epoch reads [start, end) per
split, where `end` is bounded by the partition's last stable offset (records below
it are committed or aborted for good, so the same plan always reads the same
records) and by `max_records_per_partition_per_epoch`. Records are read with
`isolation.level=read_committed`: records of aborted transactions never appear.

The consumer group gets the offsets only after a checkpoint completes, for
monitoring and for `starting="committed"`; a failing commit (broker away,
coordinator moving) is retried in the background with exponential backoff, newer
commits replace older ones, and nothing ever raises into the job (seed 003).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

import pyarrow as pa
from prometheus_client import REGISTRY, CollectorRegistry, Counter
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential

from sparkpoint.connectors.base import Positions, SlicePlan, Source, SourceContext, empty_frame
from sparkpoint.connectors.kafka_common import (
    RECORD_ARROW_SCHEMA, RECORD_SCHEMA_DDL, KafkaDataLossError, RateLimitedLog, consumer_config,
    parse_split, split_id)
from sparkpoint.errors import ConfigError, KafkaConnectorError

log = logging.getLogger(__name__)

__all__ = ["KafkaSource", "KafkaDataLossError", "KafkaSourceMetrics", "OffsetCommitter"]

StartingPosition = Literal["earliest", "latest", "committed"] | Mapping[str, int]
Reader = Literal["auto", "confluent", "spark"]



# -- metrics ------------------------------------------------------------------------------
class KafkaSourceMetrics:
    """The source's counters on one Prometheus registry. `on(registry)` returns the one
    set per registry (a registry refuses a second counter of the same name), so any
    number of sources and runs can bind to the job's registry."""

    _by_registry: "weakref.WeakKeyDictionary[CollectorRegistry, KafkaSourceMetrics]" = \
        weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.offset_commit_failures = Counter(
            "sparkpoint_kafka_offset_commit_failures",
            "Failed attempts to commit a completed checkpoint's offsets to the consumer group "
            "(retried with backoff; never fails the job)", ["group"], registry=registry)
        self.offset_commits = Counter(
            "sparkpoint_kafka_offset_commits", "Checkpoint offsets committed to the consumer group",
            ["group"], registry=registry)

    @classmethod
    def on(cls, registry: CollectorRegistry | None = None) -> "KafkaSourceMetrics":
        """The metrics on `registry`; None: prometheus_client's global registry (for
        sources used outside a job, whose metrics nobody else exports)."""
        registry = REGISTRY if registry is None else registry
        with cls._lock:
            metrics = cls._by_registry.get(registry)
            if metrics is None:
                metrics = cls._by_registry[registry] = cls(registry)
            return metrics

_METADATA_TIMEOUT_S = 30.0
# Planning runs on the job's main thread between epochs: a broker that does not answer
# within this is taken as "no new data this epoch", and asked again next time.
_PLAN_TIMEOUT_S = 5.0


# -- offset commits after checkpoint completion --------------------------------------------
@dataclass(frozen=True)
class OffsetCommit:
    checkpoint_id: int
    offsets: Mapping[str, int]  # split -> next offset to read


class OffsetCommitter:
    """Commits checkpoint offsets to a consumer group on its own thread.

    - `submit` never blocks and never raises; a commit for an older checkpoint than
      one already submitted is ignored, so committed offsets never go backwards.
    - A pending commit that fails is retried with exponential backoff; when a newer
      checkpoint completes meanwhile, the next attempt commits the newer offsets.
    - Each failed attempt counts `sparkpoint_kafka_offset_commit_failures_total`;
      the warning is logged at most once per `log_interval_s`.
    """

    def __init__(self, group_id: str, commit: Callable[[Mapping[str, int]], None], *,
                 backoff_ms: int = 100, backoff_max_ms: int = 10_000,
                 log_interval_s: float = 60.0, metrics: KafkaSourceMetrics | None = None):
        self.group_id = group_id
        self.metrics = metrics or KafkaSourceMetrics.on()
        self._commit = commit
        self._wait = wait_exponential(multiplier=backoff_ms / 1000, min=backoff_ms / 1000,
                                      max=backoff_max_ms / 1000)
        self._warn = RateLimitedLog(log, log_interval_s)
        self._cond = threading.Condition()
        self._pending: OffsetCommit | None = None
        self._latest_submitted = -1
        self._committed: OffsetCommit | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        self.failed_attempts = 0

    @property
    def committed(self) -> OffsetCommit | None:
        """The newest commit that reached the broker."""
        return self._committed

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        """Count on `registry` from now on."""
        self.metrics = KafkaSourceMetrics.on(registry)

    def submit(self, checkpoint_id: int, offsets: Mapping[str, int]) -> None:
        with self._cond:
            if self._closed or checkpoint_id <= self._latest_submitted:
                return
            self._latest_submitted = checkpoint_id
            self._pending = OffsetCommit(checkpoint_id, dict(offsets))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"kafka-offset-commit-{self.group_id}")
                self._thread.start()
            self._cond.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until every submitted commit reached the broker; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None, timeout=timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop retrying. A commit still pending is dropped: positions are in the
        checkpoint, so the group's offsets only lag until the next run commits."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- the commit thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._pending is not None)
                if self._closed:
                    return
            retrying = Retrying(
                retry=retry_if_exception_type(Exception),
                wait=self._wait,
                stop=lambda _state: self._closed,
                sleep=self._sleep_unless_superseded,
                before_sleep=self._on_failure,
                reraise=True)
            try:
                for attempt in retrying:
                    with attempt:
                        self._commit_latest()
            except Exception:  # only reached when closed while failing: dropped, see close()
                return

    def _commit_latest(self) -> None:
        with self._cond:
            request = self._pending
        if request is None:
            return
        self._commit(request.offsets)
        self.metrics.offset_commits.labels(self.group_id).inc()
        with self._cond:
            self._committed = request
            if self._pending is request:
                self._pending = None
            self._cond.notify_all()

    def _on_failure(self, state: RetryCallState) -> None:
        self.failed_attempts += 1
        self.metrics.offset_commit_failures.labels(self.group_id).inc()
        error = state.outcome.exception() if state.outcome else None
        pending = self._pending
        self._warn.warning(
            "committing offsets of checkpoint %s to consumer group %r failed (%s); retrying "
            "in the background. The job is not affected: positions are in the checkpoint.",
            pending.checkpoint_id if pending else "?", self.group_id, error)

    def _sleep_unless_superseded(self, seconds: float) -> None:
        with self._cond:
            current = self._pending
            self._cond.wait_for(lambda: self._closed or self._pending is not current,
                                timeout=seconds)


class GroupOffsetWriter:
    """Writes offsets of a consumer group without joining it (no rebalances).

    Uses an asynchronous commit and waits for its result with our own timeout: a
    synchronous commit blocks for ~45 s while the group coordinator is unavailable, and
    librdkafka's AdminClient aborts the process when timed-out offset requests meet a
    broker that comes back (rdkafka_queue.h `eonce->refcnt > 0`). Commits complete in
    the order they were sent, so a timed-out older commit that lands late is followed
    by the newer one. Used from one thread only.
    """

    def __init__(self, config: Mapping[str, Any], timeout_s: float):
        from confluent_kafka import Consumer

        self._timeout_s = timeout_s
        self._outcomes: list[str | None] = []   # per commit sent, in order: error or None
        self._sent = 0
        self._consumer = Consumer({**config, "on_commit": self._on_commit})

    def __call__(self, offsets: Mapping[str, int]) -> None:
        from confluent_kafka import TopicPartition

        partitions = [TopicPartition(*parse_split(s), int(o)) for s, o in sorted(offsets.items())]
        self._consumer.commit(offsets=partitions, asynchronous=True)
        self._sent += 1
        mine = self._sent
        deadline = time.monotonic() + self._timeout_s
        while len(self._outcomes) < mine:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaConnectorError(f"offset commit not acknowledged within {self._timeout_s:.0f}s")
            self._consumer.poll(min(remaining, 0.2))   # serves the on_commit callback
        error = self._outcomes[mine - 1]
        if error is not None:
            raise KafkaConnectorError(f"offset commit failed: {error}")

    def _on_commit(self, err: Any, partitions: Any) -> None:
        failed = [f"{tp.topic}:{tp.partition}: {tp.error}" for tp in partitions or [] if tp.error]
        self._outcomes.append(str(err) if err is not None else ("; ".join(failed) or None))

    def close(self) -> None:
        self._consumer.close()


# -- readers: offset ranges -> DataFrame ----------------------------------------------------
@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int  # exclusive


# The most messages one consume() call hands over.
_CONSUME_BATCH = 10_000


def _read_range(config: Mapping[str, Any], rng: OffsetRange, batch_rows: int,
                stall_timeout_s: float) -> Iterator[pa.RecordBatch]:
    """Records of one range, in offset order. Runs on an executor."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(dict(config))
    try:
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        pending: list[Any] = []
        last_progress = time.monotonic()
        done = False
        next_offset = rng.start
        while not done:
            # consume() returns once it holds num_messages or its timeout passed: asking
            # for more than the range still lacks would wait out the timeout every time
            # (most of a small epoch). A range ending in a transaction marker (never
            # delivered) gets the partition's EOF event in its place.
            wanted = max(1, min(_CONSUME_BATCH, rng.end - next_offset))
            messages = consumer.consume(num_messages=wanted, timeout=1.0)
            if not messages:
                if time.monotonic() - last_progress > stall_timeout_s:
                    raise KafkaConnectorError(
                        f"reading {rng.topic}:{rng.partition} offsets [{rng.start}, {rng.end}) "
                        f"made no progress for {stall_timeout_s:.0f}s; check that the brokers "
                        "are reachable")
                continue
            last_progress = time.monotonic()
            records, done = _records_before_end(messages, rng)
            next_offset = max(next_offset, messages[-1].offset() + 1)
            pending.extend(records)
            if len(pending) >= batch_rows:
                yield _to_batch(pending, rng)
                pending = []
        if pending:
            yield _to_batch(pending, rng)
    finally:
        consumer.close()


def _records_before_end(messages: list[Any], rng: OffsetRange) -> tuple[list[Any], bool]:
    """The data messages below rng.end, and whether the range is complete."""
    from confluent_kafka import KafkaError

    records = []
    for msg in messages:
        err = msg.error()
        if err is not None:
            # EOF sits at the last stable offset; with transactions the tail of a range
            # may be control records, which are never delivered, so EOF can end it.
            if err.code() == KafkaError._PARTITION_EOF:
                if msg.offset() >= rng.end:
                    return records, True
                continue
            raise KafkaConnectorError(
                f"reading {rng.topic}:{rng.partition} failed at offset {msg.offset()}: {err}")
        offset = msg.offset()
        if offset >= rng.end:
            return records, True
        records.append(msg)
        if offset == rng.end - 1:
            return records, True
    return records, False


def _to_batch(messages: list[Any], rng: OffsetRange) -> pa.RecordBatch:
    # Column-wise comprehensions: the per-record Python cost is what bounds this reader.
    n = len(messages)
    return pa.RecordBatch.from_arrays([
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.array([rng.topic] * n, pa.string()),
        pa.array([rng.partition] * n, pa.int32()),
        pa.array([m.offset() for m in messages], pa.int64()),
        pa.array([m.timestamp()[1] for m in messages], pa.int64()),
    ], schema=RECORD_ARROW_SCHEMA)


class ConfluentReader:
    """confluent-kafka consumers inside `mapInArrow`, one task per offset range."""

    def __init__(self, config: Mapping[str, Any], batch_rows: int = 65_536,
                 stall_timeout_s: float = 120.0):
        self._config = dict(config)
        self._batch_rows = batch_rows
        self._stall_timeout_s = stall_timeout_s

    def read(self, spark: Any, ranges: Sequence[OffsetRange]) -> Any:
        config, batch_rows, stall = self._config, self._batch_rows, self._stall_timeout_s

        def read_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                for row in batch.to_pylist():
                    yield from _read_range(config, OffsetRange(**row), batch_rows, stall)

        return _one_range_per_task(spark, ranges).mapInArrow(read_batches, RECORD_SCHEMA_DDL)


class SparkKafkaReader:
    """Spark's own Kafka connector in batch mode (needs its jars in `spark.jars`, see
    `kafka_common.spark_connector_jars`). Options are Java client settings: pass them
    as `spark_options={"kafka.security.protocol": ...}`."""

    def __init__(self, bootstrap_servers: str, spark_options: Mapping[str, str] | None = None):
        self._bootstrap_servers = bootstrap_servers
        self._options = dict(spark_options or {})

    def read(self, spark: Any, ranges: Sequence[OffsetRange]) -> Any:
        from pyspark.sql import functions as F

        assign: dict[str, list[int]] = {}
        starting: dict[str, dict[str, int]] = {}
        ending: dict[str, dict[str, int]] = {}
        for r in ranges:
            assign.setdefault(r.topic, []).append(r.partition)
            starting.setdefault(r.topic, {})[str(r.partition)] = r.start
            ending.setdefault(r.topic, {})[str(r.partition)] = r.end
        df = (spark.read.format("kafka")
              .option("kafka.bootstrap.servers", self._bootstrap_servers)
              .option("kafka.isolation.level", "read_committed")
              .option("assign", json.dumps(assign))
              .option("startingOffsets", json.dumps(starting))
              .option("endingOffsets", json.dumps(ending))
              .option("minPartitions", str(len(ranges)))
              .options(**self._options)
              .load())
        return df.select("key", "value", "topic", F.col("partition").cast("int"), "offset",
                         F.unix_millis("timestamp").alias("timestamp"))


# -- the source ----------------------------------------------------------------------------
class KafkaSource(Source):
    """One or more topics; every partition is a split.

    starting: where a job without a checkpoint begins: "earliest", "latest",
    "committed" (the consumer group's offsets; earliest where it has none), or
    {"timestamp": epoch_ms} (first record at or after it). Partitions discovered later
    always start at their earliest offset, so none of their records is skipped.

    reader: "confluent" (confluent-kafka in mapInArrow; needs nothing on the JVM),
    "spark" (Spark's Kafka connector; its jars in spark.jars, Java client settings in
    spark_options), or "auto" (spark when available and configurable, see
    `_choose_reader`). Both read the same bounded ranges with read_committed.

    bounded: finish (final checkpoint, status FINISHED) once every partition reached
    the last stable offset it had when this run first looked. Each run looks again,
    so a restarted run also reads what arrived in between. Default: never finish.

    A broker that cannot be reached while planning is not an error: the epoch reads
    nothing, a warning is logged at most once a minute, and planning retries.
    """

    name = "kafka"

    def __init__(self, bootstrap_servers: str, topics: str | Sequence[str], *,
                 starting: StartingPosition = "earliest", group_id: str | None = None,
                 max_records_per_partition_per_epoch: int = 100_000,
                 client_config: Mapping[str, Any] | None = None,
                 commit_backoff_ms: int = 100, commit_backoff_max_ms: int = 10_000,
                 commit_timeout_ms: int = 10_000, commit_log_interval_s: float = 60.0,
                 reader: Reader = "auto", spark_options: Mapping[str, str] | None = None,
                 records_per_task: int = 500_000, fail_on_data_loss: bool = True,
                 bounded: bool = False, name: str = "kafka"):
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics:
            raise ConfigError("KafkaSource needs at least one topic")
        self.starting = _validate_starting(starting)
        if self.starting == "committed" and not group_id:
            raise ConfigError("KafkaSource(starting='committed') needs group_id: the consumer "
                              "group whose committed offsets to start from")
        if max_records_per_partition_per_epoch < 1 or records_per_task < 1:
            raise ConfigError("max_records_per_partition_per_epoch and records_per_task must be >= 1")
        if reader not in ("auto", "confluent", "spark"):
            raise ConfigError(f"KafkaSource reader={reader!r}; accepted: 'auto', 'confluent', 'spark'")
        self.bootstrap_servers = bootstrap_servers
        self.group_id = group_id
        self.max_records = max_records_per_partition_per_epoch
        self.records_per_task = records_per_task
        self.fail_on_data_loss = fail_on_data_loss
        self.bounded = bounded
        self.name = name
        self._client_config = dict(client_config or {})
        self._commit_settings = (commit_backoff_ms, commit_backoff_max_ms, commit_timeout_ms,
                                 commit_log_interval_s)
        self._reader_kind = reader
        self._spark_options = spark_options
        self._spark: Any = None
        self._consumer: Any = None
        self._offset_writer: GroupOffsetWriter | None = None
        self._committer: OffsetCommitter | None = None
        self._data_loss_log = RateLimitedLog(log, 60.0)
        self._unreachable_log = RateLimitedLog(log, 60.0)
        self._end_offsets: Positions | None = None   # bounded: where this run stops
        self._metrics_registry: CollectorRegistry | None = None   # None: the global one
        self._last_high: dict[str, int] = {}          # last stable offsets seen by plan()

    @property
    def schema(self) -> str:
        return RECORD_SCHEMA_DDL

    # -- lifecycle ----------------------------------------------------------------------
    def open(self, ctx: SourceContext) -> None:
        from confluent_kafka import Consumer

        if self._consumer is not None:  # opened again after a failover: start clean
            self.close()
        self._spark = ctx.spark
        self._reader_kind = self._choose_reader(ctx.spark)
        # The driver's consumer only asks for metadata and offsets; it never joins the
        # group or commits, so it cannot trigger rebalances of the group's real members.
        self._consumer = Consumer(self._consumer_config(self.group_id or f"sparkpoint-{ctx.job_name}"))
        if self.group_id:
            backoff, backoff_max, timeout_ms, log_interval = self._commit_settings
            self._offset_writer = GroupOffsetWriter(self._consumer_config(self.group_id),
                                                    timeout_ms / 1000)
            self._committer = OffsetCommitter(
                self.group_id, self._offset_writer, backoff_ms=backoff,
                backoff_max_ms=backoff_max, log_interval_s=log_interval,
                metrics=KafkaSourceMetrics.on(self._metrics_registry))

    def close(self) -> None:
        if self._committer is not None:
            # The last checkpoint's offsets were queued just before close (a bounded
            # job's final checkpoint): give them one commit timeout to reach the group.
            self._committer.wait_idle(timeout_s=self._commit_settings[2] / 1000)
            # Let an attempt in flight finish before its consumer is closed under it.
            self._committer.close(timeout_s=self._commit_settings[2] / 1000 + 1)
        if self._offset_writer is not None:
            self._offset_writer.close()
            self._offset_writer = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    @property
    def committer(self) -> OffsetCommitter | None:
        return self._committer

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        """Put this source's metrics (`sparkpoint_kafka_offset_commit_failures_total`,
        `sparkpoint_kafka_offset_commits_total`) on `registry`, the one the job exports.
        Callable before or after `open`; unbound, they go to prometheus_client's global
        registry."""
        self._metrics_registry = registry
        if self._committer is not None:
            self._committer.bind_metrics(registry)

    # -- positions ------------------------------------------------------------------------
    def initial_positions(self) -> Positions:
        splits = self._all_splits()
        if self.starting == "earliest":
            return {s: self._watermarks(s)[0] for s in splits}
        if self.starting == "latest":
            return {s: self._watermarks(s)[1] for s in splits}
        if self.starting == "committed":
            return self._committed_or_earliest(splits)
        return self._at_timestamp(splits, int(self.starting["timestamp"]))  # type: ignore[index]

    def discover(self, positions: Positions) -> Positions:
        found = dict(positions)
        try:
            splits = self._all_splits(timeout_s=_PLAN_TIMEOUT_S)
        except KafkaConnectorError as e:
            if not positions:
                raise
            self._warn_unreachable(e)
            return found
        for s in splits:
            if s not in found:
                try:
                    found[s] = self._watermarks(s, _PLAN_TIMEOUT_S)[0]
                except KafkaConnectorError as e:  # picked up by a later discover
                    self._warn_unreachable(e)
                    continue
                log.info("Kafka source %s: new partition %s, reading from offset %d",
                         self.name, s, found[s])
        return found

    def plan(self, positions: Positions) -> SlicePlan:
        try:
            marks = {s: self._watermarks(s, _PLAN_TIMEOUT_S) for s in positions}
        except KafkaConnectorError as e:
            self._warn_unreachable(e)
            return SlicePlan(start=dict(positions), end=dict(positions))
        start: Positions = {}
        end: Positions = {}
        for s, pos in positions.items():
            low, high = marks[s]
            pos = int(pos)
            if pos < low:
                pos = self._on_data_loss(s, pos, low)
            elif pos > high:
                pos = self._on_position_past_end(s, pos, low, high)
            start[s] = pos
            end[s] = max(pos, min(high, pos + self.max_records))
        self._last_high = {s: marks[s][1] for s in positions}
        return SlicePlan(start=start, end=end)

    def read(self, plan: SlicePlan) -> Any:
        ranges = self._ranges(plan)
        if not ranges:
            from pyspark.sql.pandas.types import from_arrow_schema

            return empty_frame(self._spark, from_arrow_schema(RECORD_ARROW_SCHEMA))
        return self._reader().read(self._spark, ranges)

    def lag(self, positions: Positions) -> Mapping[str, int]:
        """Records behind per partition, against the offsets the last `plan` fetched: the
        progress line asks every second, on the epoch loop's thread, and must not wait for
        the broker (seconds per partition while it is down)."""
        return {s: max(0, self._last_high[s] - int(p)) for s, p in positions.items() if s in self._last_high}

    def is_exhausted(self, positions: Positions) -> bool:
        if not self.bounded:
            return False
        if self._end_offsets is None:
            try:
                self._end_offsets = {s: self._watermarks(s, _PLAN_TIMEOUT_S)[1]
                                     for s in self._all_splits(timeout_s=_PLAN_TIMEOUT_S)}
            except KafkaConnectorError as e:
                self._warn_unreachable(e)
                return False
            log.info("Kafka source %s (bounded): this run stops at offsets %s", self.name,
                     self._end_offsets)
        for s, end in self._end_offsets.items():
            pos = int(positions.get(s, 0))
            if pos < end:
                return False
            if pos > end and pos > self._last_high.get(s, end):
                # Past where this run first looked and not yet checked by plan(): maybe
                # a recreated or truncated partition; plan() reports it (data loss).
                return False
        return True

    def notify_checkpoint_complete(self, checkpoint_id: int, positions: Positions) -> None:
        try:
            if self._committer is not None:
                self._committer.submit(checkpoint_id, {s: int(p) for s, p in positions.items()})
        except Exception:  # the contract: never raise into the job
            log.exception("Kafka source %s: could not queue the offset commit of checkpoint %d",
                          self.name, checkpoint_id)

    # -- internals ------------------------------------------------------------------------
    def _consumer_config(self, group_id: str | None) -> dict[str, Any]:
        fixed: dict[str, Any] = {"enable_auto_commit": False, "isolation_level": "read_committed"}
        if group_id:
            fixed["group_id"] = group_id
        return consumer_config(self.bootstrap_servers, self._client_config, **fixed)

    def _choose_reader(self, spark: Any) -> Reader:
        """"auto": Spark's connector when the session has it (faster in
        bench/kafka_read.py), unless client settings are given only in librdkafka's
        vocabulary (client_config without spark_options), which it cannot read."""
        if self._reader_kind != "auto":
            return self._reader_kind
        if self._client_config and not self._spark_options:
            return "confluent"
        if type(spark).__module__.startswith("pyspark.sql.connect."):
            log.info("Kafka source %s reads with the confluent reader: over Spark Connect the client cannot see "
                     "whether the server has Spark's Kafka connector (reader='spark' uses it)", self.name)
            return "confluent"
        chosen: Reader = "spark" if _spark_has_kafka_connector(spark) else "confluent"
        log.info("Kafka source %s reads with the %s reader", self.name, chosen)
        return chosen

    def _reader(self) -> ConfluentReader | SparkKafkaReader:
        if self._reader_kind == "spark":
            return SparkKafkaReader(self.bootstrap_servers, self._spark_options)
        config = consumer_config(self.bootstrap_servers, self._client_config,
                                 group_id=f"sparkpoint-reader-{self.name}",
                                 enable_auto_commit=False, isolation_level="read_committed",
                                 enable_partition_eof=True, auto_offset_reset="error")
        return ConfluentReader(config)

    def _ranges(self, plan: SlicePlan) -> list[OffsetRange]:
        ranges = []
        for s, end in sorted(plan.end.items()):
            topic, partition = parse_split(s)
            start = int(plan.start.get(s, end))
            for chunk_start in range(start, int(end), self.records_per_task):
                ranges.append(OffsetRange(topic, partition, chunk_start,
                                          min(int(end), chunk_start + self.records_per_task)))
        return ranges

    def _warn_unreachable(self, error: Exception) -> None:
        self._unreachable_log.warning(
            "Kafka source %s: %s; reading nothing until the brokers answer (the job keeps "
            "running and its checkpoints go on)", self.name, error)

    def _all_splits(self, timeout_s: float = _METADATA_TIMEOUT_S) -> list[str]:
        from confluent_kafka import KafkaException

        try:
            metadata = self._consumer.list_topics(timeout=timeout_s)
        except KafkaException as e:
            raise KafkaConnectorError(f"could not list the topics of {self.bootstrap_servers}: "
                                      f"{e}") from e
        splits = []
        for topic in self.topics:
            info = metadata.topics.get(topic)
            if info is None or info.error is not None:
                raise KafkaConnectorError(
                    f"Kafka topic {topic!r} is not available at {self.bootstrap_servers} "
                    f"({info.error if info else 'unknown topic'}); create it or fix the name")
            splits.extend(split_id(topic, p) for p in sorted(info.partitions))
        return splits

    def _watermarks(self, split: str, timeout_s: float = _METADATA_TIMEOUT_S) -> tuple[int, int]:
        """(earliest, last stable) offsets; the high mark honours read_committed."""
        from confluent_kafka import TopicPartition

        try:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(*parse_split(split)), timeout=timeout_s, cached=False)
        except Exception as e:
            raise KafkaConnectorError(f"could not read the offsets of {split} from "
                                      f"{self.bootstrap_servers}: {e}") from e
        return int(low), int(high)

    def _committed_or_earliest(self, splits: Sequence[str]) -> Positions:
        from confluent_kafka import TopicPartition

        committed = self._consumer.committed(
            [TopicPartition(*parse_split(s)) for s in splits], timeout=_METADATA_TIMEOUT_S)
        positions = {}
        for s, tp in zip(splits, committed):
            positions[s] = tp.offset if tp.offset >= 0 else self._watermarks(s)[0]
        return positions

    def _at_timestamp(self, splits: Sequence[str], timestamp_ms: int) -> Positions:
        from confluent_kafka import TopicPartition

        found = self._consumer.offsets_for_times(
            [TopicPartition(*parse_split(s), timestamp_ms) for s in splits],
            timeout=_METADATA_TIMEOUT_S)
        # -1: no record at or after the timestamp yet, so start at the end.
        return {s: tp.offset if tp.offset >= 0 else self._watermarks(s)[1]
                for s, tp in zip(splits, found)}

    def _on_data_loss(self, split: str, position: int, earliest: int) -> int:
        message = (f"Kafka source {self.name}: records {position}..{earliest - 1} of {split} "
                   f"({earliest - position} records) were deleted (retention) before they were read")
        if self.fail_on_data_loss:
            raise KafkaDataLossError(message + "; raise the topic's retention, or pass "
                                     "fail_on_data_loss=False to skip them")
        self._data_loss_log.warning(message + "; skipping them (fail_on_data_loss=False)")
        return earliest

    def _on_position_past_end(self, split: str, position: int, earliest: int, end: int) -> int:
        """The checkpointed position is above the partition's end: the offsets this job
        read up to are gone. Spark's failOnDataLoss semantics: fail, or go on from the
        partition's current end."""
        what = (f"Kafka source {self.name}: the checkpointed position {position} of {split} is "
                f"above the partition's end {end} (it now holds offsets [{earliest}, {end})): the "
                "topic was deleted and recreated, or its log was truncated (e.g. an unclean leader "
                f"election); {position - end} offsets [{end}, {position}) the job had reached no "
                "longer exist")
        if self.fail_on_data_loss:
            raise KafkaDataLossError(
                what + ". Nothing was skipped. To go on from the partition's current end (offset "
                f"{end}, not reading the {end - earliest} records it now holds), run with "
                "fail_on_data_loss=False; to read the topic anew from `starting`, start the job "
                "without its checkpoints (another checkpoint directory or job name)")
        log.warning("%s. Continuing from offset %d, the partition's end (fail_on_data_loss=False): "
                    "the %d records now in [%d, %d) are skipped (if the topic was recreated, they "
                    "were never read)", what, end, end - earliest, earliest, end)
        return end


def _one_range_per_task(spark: Any, ranges: Sequence[OffsetRange]) -> Any:
    """The offset ranges as a DataFrame whose partition i holds range i alone, so each is
    read by a task of its own. Built from `spark.range` and literals, which a Spark
    Connect session has too (it has no SparkContext to `parallelize` with)."""
    from pyspark.sql import functions as F

    nth = F.col("id").cast("int") + 1

    def column(values: list[Any], sql_type: str, name: str):
        return F.element_at(F.array(*[F.lit(v) for v in values]), nth).cast(sql_type).alias(name)

    return spark.range(0, len(ranges), 1, len(ranges)).select(
        column([r.topic for r in ranges], "string", "topic"),
        column([r.partition for r in ranges], "int", "partition"),
        column([r.start for r in ranges], "bigint", "start"),
        column([r.end for r in ranges], "bigint", "end"))


def _spark_has_kafka_connector(spark: Any) -> bool:
    try:
        jvm = spark._jvm
        jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
            "kafka", spark._jsparkSession.sessionState().conf())
        return True
    except Exception:  # not on the classpath
        return False


def _validate_starting(starting: StartingPosition) -> StartingPosition:
    if starting in ("earliest", "latest", "committed"):
        return starting
    if isinstance(starting, Mapping) and set(starting) == {"timestamp"}:
        return {"timestamp": int(starting["timestamp"])}
    raise ConfigError(f"KafkaSource starting={starting!r}; accepted: 'earliest', 'latest', "
                      "'committed', or {'timestamp': epoch_ms}")
