"""A restore that falls back past a checkpoint the Kafka sink already published.

The newest checkpoints are damaged after their output reached the topic, and the rerun
restores an older one. A Kafka transaction cannot be withdrawn, so the epochs in between
must be run again exactly as first planned (their state effects applied) and not be
published a second time. The input grows between the runs, so a Kafka source planning
those epochs again would cut them differently (its last epoch was short: it had reached
the partitions' end).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from kafka_support import FAST_RECONNECT, BoundedKafkaSource, KafkaTestClient
from sparkpoint.connectors.kafka_sink import KafkaSink

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

USERS, PARTITIONS, PER_EPOCH = 7, 2, 20
FIRST_RUN, SECOND_RUN = 50, 90  # records per partition the first run reads, then the second


def _records(start: int, stop: int) -> list[tuple[int, bytes, bytes]]:
    """Records start..stop-1 of every partition: (partition, key, value)."""
    return [(p, f"u{(i * PARTITIONS + p) % USERS}".encode(), json.dumps({"amount": i % 5}).encode())
            for i in range(start, stop) for p in range(PARTITIONS)]


def _oracle(boundaries: list[int]) -> Counter:
    """What the pipeline publishes when its epochs end at these offsets (every partition):
    one running total per user an epoch touched."""
    totals: dict[str, tuple[int, int]] = {}
    out: Counter = Counter()
    for start, end in zip(boundaries, boundaries[1:]):
        touched = set()
        for _, key, value in _records(start, end):
            user, amount = key.decode(), json.loads(value)["amount"]
            n, s = totals.get(user, (0, 0))
            totals[user] = (n + 1, s + amount)
            touched.add(user)
        for user in touched:
            out[(user, json.dumps({"count": totals[user][0], "sum": totals[user][1], "user": user},
                                  sort_keys=True))] += 1
    return out


def _to_records(table: pa.Table) -> pa.Table:
    rows = table.to_pylist()
    return pa.table({"key": pa.array([r["user"] for r in rows], pa.string()),
                     "value": pa.array([json.dumps(r, sort_keys=True) for r in rows], pa.string())})


def _parse(df):
    from pyspark.sql import functions as F

    return df.select(F.col("key").cast("string").alias("user"),
                     F.get_json_object(F.col("value").cast("string"), "$.amount").cast("bigint").alias("amount"))


def _run(spark, kafka: KafkaTestClient, source_topic: str, sink_topic: str, tmp_path: Path, until: int):
    from sparkpoint import KeyedAggregate, Pipeline, Settings
    from sparkpoint.runtime.jobmaster import JobMaster
    from sparkpoint.runtime.user_code import ship_by_value

    ship_by_value(_to_records)  # this module is not importable in Spark's Python workers
    source = BoundedKafkaSource(kafka.bootstrap_servers, source_topic, group_id="fallback",
                                max_records_per_partition_per_epoch=PER_EPOCH, client_config=FAST_RECONNECT,
                                until={f"{source_topic}:{p}": until for p in range(PARTITIONS)})
    sink = KafkaSink(kafka.bootstrap_servers, sink_topic, key_column="key", value_column="value",
                     client_config=FAST_RECONNECT)
    pipeline = (Pipeline("kafka-fallback").source(source).transform(_parse)
                .stateful(KeyedAggregate("totals", ["user"], "amount", ("count", "sum"), value_type="bigint"))
                .map_output(_to_records).sink(sink))
    settings = Settings.load(overrides={
        "pipeline.name": "kafka-fallback", "execution.checkpointing.dir": str(tmp_path / "chk"),
        "state.local.dir": str(tmp_path / "state"), "execution.checkpointing.interval": "20 ms",
        # Every checkpoint is kept: a run that ends while checkpoints are in flight (every
        # 20 ms) completes many at its end, and a smaller retention pushed out the early ones
        # the rerun must fall back to (seen in a clean-clone run on a loaded machine).
        "execution.checkpointing.min-pause": "0 ms", "execution.checkpointing.num-retained": 10_000,
        "restart-strategy.type": "none", "sparkpoint.progress": False, "rest.enabled": False})
    return JobMaster(pipeline, settings, spark=spark).run()


def _checkpoint_reads(tmp_path: Path) -> dict[int, int]:
    """Completed checkpoint id -> how many records (all partitions) the source had read by it."""
    from sparkpoint.storage import metadata
    from sparkpoint.storage.fs import StorageFS
    from sparkpoint.storage.ids import list_checkpoint_ids
    from sparkpoint.storage.layout import JobLayout

    fs = StorageFS.from_url(str(tmp_path / "chk"))
    layout = JobLayout(f"{fs.root}/kafka-fallback")
    found = {}
    for cid in list_checkpoint_ids(fs, layout):
        data = metadata.read_completed(fs, layout, cid)
        if data is not None:
            source = next(h for k, h in data.handles.items() if k.startswith("source:"))
            found[cid] = sum(int(v) for v in source["positions"].values())
    return found


def test_a_restore_falling_back_past_a_published_checkpoint_publishes_no_epoch_twice(
        spark, kafka: KafkaTestClient, new_topic, tmp_path: Path) -> None:
    from sparkpoint.runtime.status import JobStatus

    source_topic, sink_topic = new_topic(partitions=PARTITIONS), new_topic(partitions=1)
    kafka.produce(source_topic, _records(0, FIRST_RUN))
    first = _run(spark, kafka, source_topic, sink_topic, tmp_path, until=FIRST_RUN)
    assert first.status == JobStatus.FINISHED
    # Epochs of the first run: 0..20, 20..40, 40..50 (the partitions' end), all published.
    published = _oracle([0, 20, 40, 50])
    assert Counter((k.decode(), v.decode()) for *_, k, v in kafka.read_committed(sink_topic)) == published

    # Damage every checkpoint but the oldest, taken before the first run had read all its
    # input: the rerun falls back to it, past epochs whose output is published already.
    # (Which epoch that is depends on timing: a slow broker may leave the first epochs
    # empty, or without a checkpoint while the sink's transactions start.)
    reads = _checkpoint_reads(tmp_path)
    oldest = min(reads)
    assert reads[oldest] < FIRST_RUN * PARTITIONS, f"no checkpoint before the last published epoch: {reads}"
    for cid in reads:
        if cid != oldest:
            (tmp_path / "chk" / "kafka-fallback" / f"chk-{cid}" / "_metadata").write_bytes(b"damaged")

    kafka.produce(source_topic, _records(FIRST_RUN, SECOND_RUN))
    second = _run(spark, kafka, source_topic, sink_topic, tmp_path, until=SECOND_RUN)

    assert second.status == JobStatus.FINISHED
    out = Counter((k.decode(), v.decode()) for *_, k, v in kafka.read_committed(sink_topic))
    expected = _oracle([0, 20, 40, 50, 70, 90])
    assert {r: n for r, n in out.items() if n > 1} == {}, "published twice"
    assert out - expected == Counter(), "published, but not the output of the epochs as first planned"
    assert expected - out == Counter(), "lost"
