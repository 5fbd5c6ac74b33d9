"""Records/s of KafkaSource's two readers over the same topic, in the same run.

    python bench/kafka_read.py                       # local broker, 1M records
    python bench/kafka_read.py --records 200000 --bootstrap-servers host:9092

Readers: "confluent" (confluent-kafka consumers inside mapInArrow, one task per
offset range) and "spark" (Spark's own Kafka connector, batch mode, with
startingOffsets/endingOffsets). Both read the same bounded ranges with
read_committed, so both are exactly-once; the faster is KafkaSource's default.
Each reader runs `--repeats` times after one warm-up; the best run counts.
Every column is consumed (sum of value lengths, max offset), so no reader can skip
the payload.

    python bench/kafka_read.py --epoch-records 200   # small epochs: seconds per epoch read

With --epoch-records, each reader reads successive epochs of that many records per
partition, as a streaming job with small epochs does, and the median seconds per epoch
read counts (a reader with a fixed wait per read shows it here, not in bulk reads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkpoint.connectors.base import SourceContext  # noqa: E402
from sparkpoint.connectors.kafka_common import spark_connector_jars  # noqa: E402
from sparkpoint.connectors.kafka_source import KafkaSource  # noqa: E402


def produce(bootstrap: str, topic: str, records: int, partitions: int) -> float:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 2_000_000, "compression.type": "lz4"})
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=b"value-%012d" % i, key=b"key-%08d" % (i % 100_000),
                                 partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(120) == 0
    return time.perf_counter() - started


def measure(spark, bootstrap: str, topic: str, reader: str, repeats: int) -> dict:
    from pyspark.sql import functions as F

    source = KafkaSource(bootstrap, topic, reader=reader,  # type: ignore[arg-type]
                         max_records_per_partition_per_epoch=10**12, records_per_task=250_000)
    source.open(SourceContext(spark=spark, job_name="bench"))
    plan = source.plan(source.initial_positions())
    expected = sum(plan.end[s] - plan.start[s] for s in plan.end)
    timings = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        row = source.read(plan).agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("bytes"),
                                    F.max("offset").alias("max_offset")).collect()[0]
        timings.append(time.perf_counter() - started)
        assert row["n"] == expected, f"{reader} read {row['n']} records, expected {expected}"
    source.close()
    best = min(timings[1:])
    return {"reader": reader, "records": expected, "best_s": round(best, 3),
            "records_per_s": round(expected / best), "runs_s": [round(t, 3) for t in timings]}


def measure_epochs(spark, bootstrap: str, topic: str, reader: str, per_partition: int, epochs: int) -> dict:
    from pyspark.sql import functions as F

    source = KafkaSource(bootstrap, topic, reader=reader,  # type: ignore[arg-type]
                         max_records_per_partition_per_epoch=per_partition)
    source.open(SourceContext(spark=spark, job_name="bench-epochs"))
    positions = source.initial_positions()
    timings = []
    for _ in range(epochs + 1):  # the first read warms up
        plan = source.plan(positions)
        expected = sum(plan.end[s] - plan.start[s] for s in plan.end)
        started = time.perf_counter()
        n = source.read(plan).agg(F.count("*").alias("n")).collect()[0]["n"]
        timings.append(time.perf_counter() - started)
        assert n == expected > 0, f"{reader} read {n} records, expected {expected}"
        positions = plan.end
    source.close()
    median = statistics.median(timings[1:])
    return {"reader": reader, "records_per_partition_per_epoch": per_partition, "epochs": epochs,
            "median_epoch_read_s": round(median, 3), "runs_s": [round(t, 3) for t in timings]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--bootstrap-servers", help="an existing cluster; default: a local broker")
    parser.add_argument("--epoch-records", type=int,
                        help="read successive epochs of this many records per partition instead")
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from sparkpoint.runtime.spark import get_or_create_spark
    from tests.servers.kafka_broker import KafkaBroker

    with tempfile.TemporaryDirectory(prefix="kafka-bench-") as tmp:
        broker = None if args.bootstrap_servers else KafkaBroker(Path(tmp) / "broker").start()
        bootstrap = args.bootstrap_servers or broker.bootstrap_servers  # type: ignore[union-attr]
        topic = f"bench-{int(time.time())}"
        produce_s = produce(bootstrap, topic, args.records, args.partitions)
        spark = get_or_create_spark(args.master, app_name="kafka-read-bench",
                                    extra_conf={"spark.jars": ",".join(spark_connector_jars())})
        if args.epoch_records:
            results = [measure_epochs(spark, bootstrap, topic, reader, args.epoch_records, args.epochs)
                       for reader in ("confluent", "spark")]
        else:
            results = [measure(spark, bootstrap, topic, reader, args.repeats)
                       for reader in ("confluent", "spark")]
        print(json.dumps({"records": args.records, "partitions": args.partitions,
                          "master": args.master, "produce_s": round(produce_s, 2),
                          "cpu_count": os.cpu_count(), "results": results}, indent=2))
        spark.stop()
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
