from __future__ import annotations

import itertools
from typing import Callable, Iterator

import pytest

from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout

BUCKET = "sparkpoint-checkpoints"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").create_bucket(Bucket=BUCKET)
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_options(s3_endpoint: str) -> dict:
    return {"key": "test", "secret": "test", "skip_instance_cache": True,
            "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}


_jobs = itertools.count()


@pytest.fixture
def s3_job(s3_options: dict) -> Callable[[], tuple[StorageFS, JobLayout]]:
    """A fresh job name per test; each call gives a new client (like a separate process)."""
    name = f"job-{next(_jobs)}"

    def open_job() -> tuple[StorageFS, JobLayout]:
        fs = StorageFS.from_url(f"s3://{BUCKET}", storage_options=s3_options)
        return fs, JobLayout(f"{fs.root}/{name}")

    return open_job
