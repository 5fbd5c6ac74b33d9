"""The Kafka source's confluent reader reads each offset range in a task of its own. The
ranges are laid out with `spark.range` and literals (a Spark Connect session has no
SparkContext to `parallelize` with): partition i must hold range i and nothing else."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkpoint.connectors.kafka_source import OffsetRange, _one_range_per_task

pytestmark = pytest.mark.spark


def test_each_offset_range_is_read_by_a_task_of_its_own(spark):
    ranges = [OffsetRange("orders", 0, 0, 500), OffsetRange("orders", 1, 17, 2**40),
              OffsetRange("payments", 0, 3, 4), OffsetRange("orders", 2, 9, 9)]
    seen_schema = pa.schema([("task", pa.int32()), ("topic", pa.string()), ("partition", pa.int32()),
                             ("start", pa.int64()), ("end", pa.int64())])

    def ranges_by_task(batches):  # nested: shipped by value to the Python workers
        from pyspark import TaskContext

        task = TaskContext.get().partitionId()
        for batch in batches:
            for row in batch.to_pylist():
                yield pa.RecordBatch.from_pylist([{"task": task, **row}], schema=seen_schema)

    seen = (_one_range_per_task(spark, ranges)
            .mapInArrow(ranges_by_task, "task int, topic string, partition int, start bigint, end bigint")
            .toArrow().to_pylist())
    assert sorted((r["task"], OffsetRange(r["topic"], r["partition"], r["start"], r["end"])) for r in seen) == \
        list(enumerate(ranges))
