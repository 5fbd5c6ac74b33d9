"""A local S3 API server (moto's, in a child process) on 127.0.0.1.

A process of its own, not a thread of the test's: delta-rs holds the GIL while it waits
for S3, so a test that reads or writes a Delta table through it would wait forever on a
server answering from a thread of the same process. Jobs started as subprocesses and
Spark's Python workers reach it the same way as the test does.

    with S3Server() as s3:
        s3.create_bucket("my-bucket")
        fs = StorageFS.from_url("s3://my-bucket", storage_options=s3.storage_options())
"""

from __future__ import annotations

import subprocess
import sys
import time
from types import TracebackType

from tests.servers.lifetime import die_with_parent, free_port

REGION = "us-east-1"
_READY_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 10.0


class S3ServerError(RuntimeError):
    """The local S3 API server did not start."""


class S3Server:
    """moto's S3 API server; every bucket lives in its memory until stop()."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None

    @property
    def endpoint(self) -> str:
        if self._port is None or self._process is None:
            raise S3ServerError("the S3 server has not been started: call start() first")
        return f"http://127.0.0.1:{self._port}"

    def storage_options(self) -> dict:
        """s3fs storage options for this server (a new dict per call: callers add their own keys)."""
        return {"key": "test", "secret": "test",
                "client_kwargs": {"endpoint_url": self.endpoint, "region_name": REGION}}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id="test", aws_secret_access_key="test")

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def start(self) -> "S3Server":
        if self._process is not None and self._process.poll() is None:
            return self
        self._port = free_port()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self._port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_parent())
        client = self.client()
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while True:
            try:
                client.list_buckets()
                return self
            except Exception:  # not listening yet: keep polling until the deadline
                if self._process.poll() is not None or time.monotonic() > deadline:
                    code = self._process.poll()
                    self.stop()
                    raise S3ServerError(f"the moto S3 server on port {self._port} did not start "
                                        f"(exit code {code}); is moto[server] installed?") from None
                time.sleep(0.2)

    def stop(self) -> None:
        proc, self._process = self._process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(_STOP_TIMEOUT_S)

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
