"""`sparkpoint chaos --storm` beyond Parquet on local disk: every fault kind (kill9,
outage, corrupt, second, executor-kill, restore-outage) over several seeds, on a Delta
sink with checkpoints on an S3 API, and on Kafka source and sink (a real broker). One job
per setting takes every fault once per seed (a Spark start per seed, not per fault), and
its committed output must equal the fault-free run's: 0 rows lost, 0 duplicated.

Seeds: SPARKPOINT_CHAOS_SEED (first, default 1) and SPARKPOINT_CHAOS_SEEDS (how many; CI
runs 5 in all: 3 on Delta/S3, 2 on Kafka; `make chaos` runs 20 on each). Each test writes
its report (chaos-report.md) to SPARKPOINT_CHAOS_OUT (default: its tmp directory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

FIRST_SEED = int(os.environ.get("SPARKPOINT_CHAOS_SEED", "1"))
SEEDS = os.environ.get("SPARKPOINT_CHAOS_SEEDS")
FAULTS = os.environ.get("SPARKPOINT_CHAOS_FAULTS", "kill9,outage,corrupt,second,executor-kill,restore-outage")
CONFIG = """\
execution.checkpointing.interval: 1 s
sparkpoint.lease.ttl: 4 s
restart-strategy.type: fixed-delay
restart-strategy.fixed-delay.delay: 200 ms
parallelism.default: 2
"""

# Event-time windows with no late events: the windows' counts and sums are the same
# whatever the epoch boundaries (the fault-free run's rows are every run's rows).
DELTA_PIPELINE = """\
from sparkpoint import DeltaSink, GeneratorSource, Pipeline, TumblingWindow
pipeline = (
    Pipeline("chaos-delta")
    .source(GeneratorSource("events", keys=50, total_events={total}, max_records_per_epoch=1_000, splits=2,
                            disorder_ms=0, event_time_per_s=2_000))
    .watermark("ts", delay="2 s")
    .stateful(TumblingWindow("windows", ["key"], "ts", size="2 s", aggs=("count", "sum"), value_column="value",
                             value_type="bigint"))
    .sink(DeltaSink("out"))
)
"""

# The Kafka example's shape: all input is produced first, so epoch boundaries are a pure
# function of the restored offsets and even update-mode totals match the fault-free run.
KAFKA_PIPELINE = """\
import json
import pyarrow as pa
from sparkpoint import KeyedAggregate, Pipeline
from sparkpoint.connectors.kafka_common import decode_json
from sparkpoint.connectors.kafka_sink import KafkaSink
from sparkpoint.connectors.kafka_source import KafkaSource

def parse(df):
    return decode_json(df, "user string, amount bigint").selectExpr("data.user AS user", "data.amount AS amount")

def to_records(t):
    rows = t.to_pylist()
    return pa.table({{"key": pa.array([r["user"] for r in rows], pa.string()),
                     "value": pa.array([json.dumps(r, sort_keys=True) for r in rows], pa.string())}})

pipeline = (
    Pipeline("chaos-kafka")
    .source(KafkaSource({bootstrap!r}, "events", group_id="production", max_records_per_partition_per_epoch=300,
                        bounded=True))
    .transform(parse)
    .stateful(KeyedAggregate("totals", ["user"], "amount", value_type="bigint"))
    .map_output(to_records)
    .sink(KafkaSink({bootstrap!r}, "totals", key_column="key", value_column="value"))
)
"""


def _seeds(default: int) -> int:
    return int(SEEDS) if SEEDS else default


def _out(tmp_path: Path, name: str) -> Path:
    out = Path(os.environ.get("SPARKPOINT_CHAOS_OUT", tmp_path)) / name
    out.mkdir(parents=True, exist_ok=True)
    return out


def _storm(tmp_path: Path, pipeline: Path, workdir: Path, first_seed: int, seeds: int,
           *extra: str) -> dict:
    (tmp_path / "chaos.yaml").write_text(CONFIG)
    proc = subprocess.run(
        [sys.executable, "-m", "sparkpoint.ops.cli", "chaos", str(pipeline), "--config", str(tmp_path / "chaos.yaml"),
         "--storm", "--faults", FAULTS, "--seed", str(first_seed), "--seeds", str(seeds), "--workdir", str(workdir),
         "--timeout", "600", "--json", *extra],
        cwd=REPO, env=dict(os.environ, PYSPARK_PYTHON=sys.executable), capture_output=True, text=True,
        timeout=600 + 300 * seeds)
    report_file = workdir / "chaos-report.md"
    assert report_file.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    print("\n" + report_file.read_text())
    report = json.loads(proc.stdout)
    return report


def _assert_every_fault_every_seed_exactly_once(report: dict, first_seed: int, seeds: int) -> None:
    wanted = {(f, s) for f in FAULTS.split(",") for s in range(first_seed, first_seed + seeds)}
    got = {(v["fault"], v["seed"]) for v in report["faults"]}
    assert got == wanted, sorted(wanted - got)
    failed = [(v["fault"], v["seed"], v["injected"], v["notes"]) for v in report["faults"] if not v["passed"]]
    assert not failed, failed
    for v in report["faults"]:
        assert (v["lost"], v["duplicated"], v["unexpected"]) == (0, 0, 0), v
        assert v["committed"] == report["reference"]["rows"] > 0, v
    assert report["ok"]


def test_chaos_storm_on_a_delta_sink_with_checkpoints_on_s3_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    from tests.e2e.delta_job import s3_server_process

    seeds = _seeds(3)
    pipeline = tmp_path / "delta_pipeline.py"
    # Enough input that every segment (a Spark start, then about 30 s of faults) ends
    # before the input does.
    pipeline.write_text(DELTA_PIPELINE.format(total=20_000 + 30_000 * seeds))
    with s3_server_process("chaos") as options:
        report = _storm(tmp_path, pipeline, _out(tmp_path, "delta-s3"), FIRST_SEED, seeds,
                        "--checkpoint-dir", "s3://chaos/runs",
                        "--set", f"execution.checkpointing.storage-options={json.dumps(options)}")
    assert (report["sink"], report["storage"]) == ("delta", "s3")
    _assert_every_fault_every_seed_exactly_once(report, FIRST_SEED, seeds)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from sparkpoint.testing.kafka_broker import KafkaBroker

    with KafkaBroker(tmp_path_factory.mktemp("kafka-chaos")) as kafka:
        yield kafka


def _produce(bootstrap: str, count: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic, parts in (("events", 3), ("totals", 1)):
        admin.create_topics([NewTopic(topic, parts, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(count):
        producer.produce("events", json.dumps({"user": f"u{i % 97}", "amount": i % 13}).encode(), partition=i % 3)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def _group_offsets(bootstrap: str, group: str) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return [tp.offset for tp in consumer.committed([TopicPartition("events", p) for p in range(3)], timeout=30)]
    finally:
        consumer.close()


def test_chaos_storm_on_kafka_source_and_sink_loses_and_duplicates_nothing_and_leaves_production_alone(
        tmp_path: Path, broker) -> None:
    seeds = _seeds(2)
    first = FIRST_SEED + (0 if SEEDS else 3)  # CI: seeds 4 and 5 here, 1-3 on Delta
    _produce(broker.bootstrap_servers, 30_000 + 40_000 * seeds)
    pipeline = tmp_path / "kafka_pipeline.py"
    pipeline.write_text(KAFKA_PIPELINE.format(bootstrap=broker.bootstrap_servers))
    report = _storm(tmp_path, pipeline, _out(tmp_path, "kafka"), first, seeds)
    assert report["sink"] == "kafka"
    _assert_every_fault_every_seed_exactly_once(report, first, seeds)
    # The runs had consumer groups and topics of their own: production's group committed
    # nothing, and production's output topic got no record.
    from sparkpoint.ops.chaos import kafka_rows

    assert all(offset < 0 for offset in _group_offsets(broker.bootstrap_servers, "production"))
    assert not kafka_rows(broker.bootstrap_servers, "totals")
