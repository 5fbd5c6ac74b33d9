"""Exclusive create: racing processes on local disk, and the S3 error answers. Racing
threads and a second writer on every backend are in
tests/contracts/test_checkpoint_storage_contract.py."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import fsspec
import pytest

from sparkpoint.errors import StorageError
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.objectstore import create_exclusive_object


def _create_in_process(root: str, path: str, i: int, start: "multiprocessing.synchronize.Barrier",
                       results: "multiprocessing.Queue[str]") -> None:
    fs = StorageFS.from_url(root)
    start.wait()  # all processes are imported and ready: now they race
    try:
        fs.create_exclusive(path, f"process-{i}".encode())
        results.put(f"won:{i}")
    except FileExistsError:
        results.put("lost")


def test_processes_racing_on_local_disk_exactly_one_wins(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(3), ctx.Queue()
    path = f"{tmp_path}/job/chk-1/_metadata"
    procs = [ctx.Process(target=_create_in_process, args=(str(tmp_path), path, i, start, results))
             for i in range(3)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1 and outcomes.count("lost") == 2
    assert Path(path).read_bytes() == f"process-{winners[0][4:]}".encode()


def test_store_without_conditional_writes_is_refused_clearly() -> None:
    class NoConditionalWrites(fsspec.AbstractFileSystem):
        protocol = "gcs-like"

    with pytest.raises(StorageError, match="cannot create .* exclusively.*s3://"):
        create_exclusive_object(NoConditionalWrites(), "bucket/job/chk-1/_metadata", b"x")


class FakeS3:
    """Answers conditional PUTs with scripted S3 errors, the way s3fs surfaces them."""

    protocol = ("s3", "s3a")

    def __init__(self, *answers: tuple[str, int] | None):
        self.answers = list(answers)
        self.calls = 0

    def pipe_file(self, path: str, data: bytes, mode: str = "overwrite") -> None:
        from botocore.exceptions import ClientError

        assert mode == "create"
        self.calls += 1
        answer = self.answers.pop(0)
        if answer is None:
            return
        code, status = answer
        error = ClientError({"Error": {"Code": code, "Message": "no"},
                             "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")
        raise OSError(22, "translated by s3fs") from error

    def invalidate_cache(self, path: str) -> None:
        pass


def test_s3_412_without_condition_element_means_exists() -> None:
    with pytest.raises(FileExistsError):
        create_exclusive_object(FakeS3(("PreconditionFailed", 412)), "b/job/chk-1/_metadata", b"x")


def test_s3_409_conflict_is_retried() -> None:
    fake = FakeS3(("ConditionalRequestConflict", 409), None)
    create_exclusive_object(fake, "b/job/chk-1/_metadata", b"x")
    assert fake.calls == 2


def test_s3_other_errors_are_storage_errors_naming_the_path() -> None:
    with pytest.raises(StorageError, match="b/job/chk-1/_metadata failed: AccessDenied"):
        create_exclusive_object(FakeS3(("AccessDenied", 403)), "b/job/chk-1/_metadata", b"x")
