"""Pieces of the Delta sink's tests: the pipeline (the keyed aggregate of the Parquet
sink's exactly-once tests, into a Delta table) and reading a table back. On S3 they use
the run's S3 server (tests/servers/s3_server.py), a process of its own: delta-rs holds
the GIL while it waits for S3, so a server answering from a thread of the test's process
would wait for the GIL the request holds."""

from __future__ import annotations

import pyarrow as pa

# A template for tests.e2e.harness.Job (it fills in job, keys, total, per_epoch and out).
DELTA_PIPELINE = """
from sparkpoint import DeltaSink, GeneratorSource, KeyedAggregate, Pipeline
pipeline = (
    Pipeline("{job}")
    .source(GeneratorSource("events", keys={keys}, total_events={total}, max_records_per_epoch={per_epoch}))
    .stateful(KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
    .sink(DeltaSink(SINK_PATH, storage_options=SINK_OPTIONS, merge_keys=MERGE_KEYS))
)
"""


def delta_pipeline(url: str | None = None, storage_options: dict | None = None,
                   merge_keys: list[str] | None = None) -> str:
    """DELTA_PIPELINE writing to `url` (default: the Job's `out` directory), appending, or
    merging by `merge_keys`."""
    path = "r'{out}'" if url is None else _escape(repr(url))
    return (DELTA_PIPELINE.replace("SINK_PATH", path).replace("SINK_OPTIONS", _escape(repr(storage_options or {})))
            .replace("MERGE_KEYS", repr(merge_keys)))


def _escape(literal: str) -> str:
    return literal.replace("{", "{{").replace("}", "}}")


def read_delta(url: str, delta_options: dict[str, str] | None = None) -> pa.Table:
    """Everything the table's readers see, through delta-rs (not through sparkpoint)."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(url, delta_options):
        return pa.table({})
    return DeltaTable(url, storage_options=delta_options).to_pyarrow_table()
