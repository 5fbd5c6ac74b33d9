from __future__ import annotations

import itertools
from typing import Callable

import pytest

from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout
from tests.servers.s3_server import S3Server


@pytest.fixture
def s3_options(s3_server: S3Server) -> dict:
    """The run's S3 server; no cached client, so each StorageFS is a client of its own
    (like a separate process)."""
    return {**s3_server.storage_options(), "skip_instance_cache": True}


_jobs = itertools.count()


@pytest.fixture
def s3_job(s3_bucket: str, s3_options: dict) -> Callable[[], tuple[StorageFS, JobLayout]]:
    """A fresh bucket per test; each call gives a new client (like a separate process)."""
    name = f"job-{next(_jobs)}"

    def open_job() -> tuple[StorageFS, JobLayout]:
        fs = StorageFS.from_url(f"s3://{s3_bucket}", storage_options=s3_options)
        return fs, JobLayout(f"{fs.root}/{name}")

    return open_job
