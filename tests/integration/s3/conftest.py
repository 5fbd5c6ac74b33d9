from __future__ import annotations

import itertools
from typing import Callable, Iterator

import pytest

from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout

BUCKET = "sparkpoint-checkpoints"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from sparkpoint.testing.s3_server import local_s3

    with local_s3(BUCKET) as options:
        yield options["client_kwargs"]["endpoint_url"]


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
