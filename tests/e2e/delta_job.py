"""Pieces of the Delta sink's tests: the pipeline (the keyed aggregate of the Parquet
sink's exactly-once tests, into a Delta table) and an S3 API server in a process of its
own. delta-rs holds the GIL while it waits for S3, so a test that reads or writes a table
through it cannot talk to `sparkpoint.testing.s3_server.local_s3`, whose server answers
from a thread of the same process: every request would wait for the GIL it holds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pyarrow as pa

# A template for tests.e2e.harness.Job (it fills in job, keys, total, per_epoch and out).
DELTA_PIPELINE = """
from sparkpoint import DeltaSink, GeneratorSource, KeyedAggregate, Pipeline
pipeline = (
    Pipeline("{job}")
    .source(GeneratorSource("events", keys={keys}, total_events={total}, max_records_per_epoch={per_epoch}))
    .stateful(KeyedAggregate("totals", ["key"], "value", value_type="bigint"))
    .sink(DeltaSink(SINK_PATH, storage_options=SINK_OPTIONS))
)
"""


def delta_pipeline(url: str | None = None, storage_options: dict | None = None) -> str:
    """DELTA_PIPELINE writing to `url` (default: the Job's `out` directory)."""
    path = "r'{out}'" if url is None else _escape(repr(url))
    return DELTA_PIPELINE.replace("SINK_PATH", path).replace("SINK_OPTIONS", _escape(repr(storage_options or {})))


def _escape(literal: str) -> str:
    return literal.replace("{", "{{").replace("}", "}}")


REGION = "us-east-1"


def read_delta(url: str, delta_options: dict[str, str] | None = None) -> pa.Table:
    """Everything the table's readers see, through delta-rs (not through sparkpoint)."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(url, delta_options):
        return pa.table({})
    return DeltaTable(url, storage_options=delta_options).to_pyarrow_table()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def s3_server_process(*buckets: str) -> Iterator[dict]:
    """moto's S3 API server as a child process on 127.0.0.1; yields s3fs storage options."""
    import boto3

    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ))
    try:
        client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="test",
                              aws_secret_access_key="test")
        deadline = time.monotonic() + 60
        while True:
            try:
                client.list_buckets()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server on port {port} did not start (exit code {proc.poll()})")
                time.sleep(0.2)
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": endpoint, "region_name": REGION}}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
