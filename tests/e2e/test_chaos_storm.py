"""`sparkpoint chaos --storm` beyond Parquet on local disk: every fault kind (kill9,
outage, corrupt, second, executor-kill, restore-outage) over several seeds, on a Delta
sink with checkpoints on an S3 API, and on Kafka source and sink (a real broker). One job
per setting takes every fault once per seed (a Spark start per seed, not per fault), and
its committed output must equal an oracle's: 0 rows lost, 0 duplicated.

The oracles are batch computations of what the pipeline must commit, from the input
alone (no failure-free reference job: that would cost a Spark start and the whole input
again): the generator's events recomputed with Spark's own hash, and the Kafka input the
test produced folded epoch by epoch.

Seeds: SPARKPOINT_CHAOS_SEED (first, default 1) and SPARKPOINT_CHAOS_SEEDS (how many;
`make chaos` runs 20 on each). `make test` runs 3 in all: seeds 3 and 4 on Delta/S3, seed
5 on Kafka, as a Kafka seed costs about twice a Delta one (its epochs are paced by a
sleep, every fault a broker reconnect). Every seed injects every fault kind; what more
seeds add is other moments. The two Delta seeds are the ones whose `corrupt` damages
each of the two things it can: seed 3 the newest checkpoint's `_metadata`, seed 4 a state
file only the newest checkpoint has (seeds 1 and 2 both damage a `_metadata`). Each
test writes its report (chaos-report.md) to SPARKPOINT_CHAOS_OUT (default: its tmp
directory).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkpoint.ops.chaos import Chaos, kafka_rows
from tests.e2e.chaos_oracles import user_totals_records, window_rows
from tests.servers.names import unique_name

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

SEEDS = os.environ.get("SPARKPOINT_CHAOS_SEEDS")
FIRST_SEED = int(os.environ.get("SPARKPOINT_CHAOS_SEED", "1"))
# `make test`'s Delta seeds (see above): chaos draws a segment's moments and its `corrupt`
# target from random.Random(f"{seed}:storm"), so a seed picks the same target every run.
DELTA_FIRST_SEED = int(os.environ.get("SPARKPOINT_CHAOS_SEED", "1" if SEEDS else "3"))
FAULTS = os.environ.get("SPARKPOINT_CHAOS_FAULTS", "kill9,outage,corrupt,second,executor-kill,restore-outage")
KAFKA_FAULTS = FAULTS
CONFIG = """\
execution.checkpointing.interval: 1 s
sparkpoint.lease.ttl: 4 s
restart-strategy.type: fixed-delay
restart-strategy.fixed-delay.delay: 200 ms
parallelism.default: 2
"""

# Event-time windows with no late events: the windows' counts and sums are the same
# whatever the epoch boundaries, so the input may be paced by wall time (rate_per_s):
# the job lasts about as long on a fast machine as on a slow one. The storm's last
# segment gets no fault once restored (SPARKPOINT_CHAOS_FAULTS_DONE): it runs unpaced and
# in larger epochs, since it reads what every earlier segment left.
KEYS, EVENT_TIME_PER_S, WINDOW_MS, START_TS = 50, 2_000, 2_000, 1_700_000_000_000
RATE_PER_S, EVENTS_PER_SEED = 400, 16_000  # 40 s of input per segment
DELTA_PIPELINE = """\
import os
from sparkpoint import DeltaSink, GeneratorSource, Pipeline, TumblingWindow
pipeline = (
    Pipeline("chaos-delta")
    .source(GeneratorSource("events", keys=50, total_events={total},
                            rate_per_s=None if os.environ.get("SPARKPOINT_CHAOS_FAULTS_DONE") else {rate},
                            max_records_per_epoch=20_000 if os.environ.get("SPARKPOINT_CHAOS_FAULTS_DONE") else 1_000,
                            splits=2,
                            disorder_ms=0, event_time_per_s=2_000))
    .watermark("ts", delay="2 s")
    .stateful(TumblingWindow("windows", ["key"], "ts", size="2 s", aggs=("count", "sum"), value_column="value",
                             value_type="bigint"))
    .sink(DeltaSink("out"))
)
"""

# The Kafka example's shape: all input is produced first, so epoch boundaries are a pure
# function of the restored offsets and even update-mode totals are known in advance. The
# driver waits a little each epoch so the job does not outrun the faults on a fast machine
# (not in the storm's last segment, which gets no fault once restored). The epochs keep
# their size there: the update-mode rows the oracle expects depend on the epoch
# boundaries. That segment reads what every earlier one left, which grows with the seeds
# (about 100k records after 20 on a loaded machine), so a storm gives each run more time
# the more seeds it has.
USERS, AMOUNTS, PARTITIONS, PER_PARTITION = 97, 13, 3, 200
KAFKA_EVENTS_PER_SEED = 20_000  # about 33 epochs of at least 1 s per segment
KAFKA_PIPELINE = """\
import json
import os
import time
import pyarrow as pa
from sparkpoint import KeyedAggregate, Pipeline
from sparkpoint.connectors.kafka_common import decode_json
from sparkpoint.connectors.kafka_sink import KafkaSink
from sparkpoint.connectors.kafka_source import KafkaSource

def parse(df):
    time.sleep(0.0 if os.environ.get("SPARKPOINT_CHAOS_FAULTS_DONE") else 1.0)
    return decode_json(df, "user string, amount bigint").selectExpr("data.user AS user", "data.amount AS amount")

def to_records(t):
    rows = t.to_pylist()
    return pa.table({{"key": pa.array([r["user"] for r in rows], pa.string()),
                     "value": pa.array([json.dumps(r, sort_keys=True) for r in rows], pa.string())}})

pipeline = (
    Pipeline("chaos-kafka")
    .source(KafkaSource({bootstrap!r}, {events!r}, group_id="production", max_records_per_partition_per_epoch=200,
                        bounded=True))
    .transform(parse)
    .stateful(KeyedAggregate("totals", ["user"], "amount", value_type="bigint"))
    .map_output(to_records)
    .sink(KafkaSink({bootstrap!r}, {totals!r}, key_column="key", value_column="value"))
)
"""


def _seeds(default: int) -> int:
    return int(SEEDS) if SEEDS else default


def _out(tmp_path: Path, name: str) -> Path:
    out = Path(os.environ.get("SPARKPOINT_CHAOS_OUT", tmp_path)) / name
    out.mkdir(parents=True, exist_ok=True)
    return out


def _storm(tmp_path: Path, pipeline: Path, workdir: Path, first_seed: int, seeds: int, expected: Counter,
           sets: tuple[str, ...] = (), checkpoint_base: str | None = None, faults: str = FAULTS) -> dict:
    (tmp_path / "chaos.yaml").write_text(CONFIG)
    began = time.monotonic()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    chaos = Chaos(str(pipeline), str(tmp_path / "chaos.yaml"), sets, faults.split(","), first_seed, workdir,
                  timeout=600 + 45 * seeds, kills=None, echo=print, seeds=seeds, storm=True,
                  checkpoint_base=checkpoint_base, expected=expected)
    report = chaos.run()
    print(f"\n{report.render()}\n(storm of {seeds} seed(s): {time.monotonic() - began:.0f} s)")
    assert (workdir / "chaos-report.md").read_text().startswith("sparkpoint chaos ")
    return report.to_dict()


def _assert_every_fault_every_seed_exactly_once(report: dict, first_seed: int, seeds: int,
                                                faults: str = FAULTS) -> None:
    wanted = {(f, s) for f in faults.split(",") for s in range(first_seed, first_seed + seeds)}
    got = {(v["fault"], v["seed"]) for v in report["faults"]}
    assert got == wanted, sorted(wanted - got)
    failed = [(v["fault"], v["seed"], v["injected"], v["notes"]) for v in report["faults"] if not v["passed"]]
    assert not failed, failed
    for v in report["faults"]:
        assert (v["lost"], v["duplicated"], v["unexpected"]) == (0, 0, 0), v
        assert v["committed"] == report["reference"]["rows"] > 0, v
    assert report["ok"]


# -- the oracles ------------------------------------------------------------------------

def windows_oracle(total: int) -> Counter:
    """Every row DELTA_PIPELINE commits: its generator's windows (tests/e2e/chaos_oracles.py),
    as chaos compares rows (a tuple of the columns in sorted order, `epoch` left out)."""
    return Counter(tuple(row[c] for c in sorted(row)) for row in window_rows(
        total, keys=KEYS, event_time_per_s=EVENT_TIME_PER_S, disorder_ms=0, start_ts_ms=START_TS,
        window_ms=WINDOW_MS))


def kafka_oracle(count: int) -> Counter:
    """Every (key, value) KAFKA_PIPELINE commits for the input _produce wrote: each epoch
    reads PER_PARTITION records of every partition, and every user it touched gets its
    running totals as one record."""
    lengths = [len(range(p, count, PARTITIONS)) for p in range(PARTITIONS)]
    epochs = -(-max(lengths, default=0) // PER_PARTITION)

    def events(epoch: int):
        for p in range(PARTITIONS):
            for offset in range(PER_PARTITION * epoch, min(PER_PARTITION * (epoch + 1), lengths[p])):
                i = offset * PARTITIONS + p
                yield f"u{i % USERS}", i % AMOUNTS

    return Counter(user_totals_records(events(e) for e in range(epochs)))


def _timeout(default_seeds: int) -> int:
    """pytest's per-test limit for a storm: a Spark start and about a minute per seed."""
    return max(900, 300 + 300 * _seeds(default_seeds))


@pytest.mark.s3
@pytest.mark.timeout(_timeout(2))
def test_chaos_storm_on_a_delta_sink_with_checkpoints_on_s3_loses_and_duplicates_nothing(
        tmp_path: Path, s3_server, s3_bucket: str) -> None:
    seeds = _seeds(2)
    total = EVENTS_PER_SEED * seeds + EVENTS_PER_SEED // 2  # paced by wall time: RATE_PER_S
    pipeline = tmp_path / "delta_pipeline.py"
    pipeline.write_text(DELTA_PIPELINE.format(total=total, rate=RATE_PER_S))
    report = _storm(tmp_path, pipeline, _out(tmp_path, "delta-s3"), DELTA_FIRST_SEED, seeds,
                    windows_oracle(total),
                    sets=(f"execution.checkpointing.storage-options={json.dumps(s3_server.storage_options())}",),
                    checkpoint_base=f"s3://{s3_bucket}/runs")
    assert (report["sink"], report["storage"]) == ("delta", "s3")
    _assert_every_fault_every_seed_exactly_once(report, DELTA_FIRST_SEED, seeds)


@dataclass(frozen=True)
class KafkaTopics:
    """The production input and output topics of one test, on the run's shared broker."""

    events: str
    totals: str


@pytest.fixture
def topics(request: pytest.FixtureRequest) -> KafkaTopics:
    return KafkaTopics(unique_name(f"events-{request.node.name}"), unique_name(f"totals-{request.node.name}"))


def kafka_pipeline(bootstrap: str, topics: KafkaTopics) -> str:
    return KAFKA_PIPELINE.format(bootstrap=bootstrap, events=topics.events, totals=topics.totals)


def _produce(bootstrap: str, topics: KafkaTopics, count: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic, parts in ((topics.events, 3), (topics.totals, 1)):
        admin.create_topics([NewTopic(topic, parts, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(count):
        producer.produce(topics.events, json.dumps({"user": f"u{i % USERS}", "amount": i % AMOUNTS}).encode(),
                         partition=i % PARTITIONS)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def _group_offsets(bootstrap: str, group: str, topic: str) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return [tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in range(3)], timeout=30)]
    finally:
        consumer.close()


@pytest.mark.kafka
@pytest.mark.timeout(_timeout(1))
def test_chaos_storm_on_kafka_source_and_sink_loses_and_duplicates_nothing_and_leaves_production_alone(
        tmp_path: Path, kafka_broker, topics: KafkaTopics) -> None:
    seeds = _seeds(1)
    first = FIRST_SEED + (0 if SEEDS else 4)  # make test: seed 5 here, 3-4 on Delta
    count = KAFKA_EVENTS_PER_SEED * seeds + KAFKA_EVENTS_PER_SEED // 2
    _produce(kafka_broker.bootstrap_servers, topics, count)
    pipeline = tmp_path / "kafka_pipeline.py"
    pipeline.write_text(kafka_pipeline(kafka_broker.bootstrap_servers, topics))
    # `corrupt` included: a restore that falls back past a checkpoint the Kafka sink
    # already published replays the epochs in between without publishing them again.
    report = _storm(tmp_path, pipeline, _out(tmp_path, "kafka"), first, seeds, kafka_oracle(count),
                    faults=KAFKA_FAULTS)
    assert report["sink"] == "kafka"
    _assert_every_fault_every_seed_exactly_once(report, first, seeds, KAFKA_FAULTS)
    # The runs had consumer groups and topics of their own: production's group committed
    # nothing, and production's output topic got no record.
    assert all(offset < 0 for offset in _group_offsets(kafka_broker.bootstrap_servers, "production", topics.events))
    assert not kafka_rows(kafka_broker.bootstrap_servers, topics.totals)
