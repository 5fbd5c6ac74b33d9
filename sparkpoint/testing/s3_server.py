"""A local S3 API server (moto in server mode) on 127.0.0.1, for tests and for
rehearsing object-store checkpoints without a cloud account."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

REGION = "us-east-1"


@contextmanager
def local_s3(*buckets: str) -> Iterator[dict]:
    """Start the server, create `buckets`, yield s3fs storage options (usable as
    `execution.checkpointing.storage-options`); stop the server on exit."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="test",
                              aws_secret_access_key="test")
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": endpoint, "region_name": REGION}}
    finally:
        server.stop()
