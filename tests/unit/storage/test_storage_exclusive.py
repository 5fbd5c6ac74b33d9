"""Exclusive create on local disk: of many racing writers exactly one wins, and a
reader never sees a partial file (the seed 002/003 `_metadata already exists` races)."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import fsspec
import pytest

from sparkpoint.errors import StorageError
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.objectstore import create_exclusive_object


def _race(fs: StorageFS, path: str, writers: int) -> list[str]:
    barrier = threading.Barrier(writers)
    outcomes: list[str] = []

    def write(i: int) -> None:
        barrier.wait()
        try:
            fs.create_exclusive(path, f"writer-{i}".encode() * 1000)
            outcomes.append(f"won:{i}")
        except FileExistsError:
            outcomes.append("lost")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_threads_racing_on_local_disk_exactly_one_wins(tmp_path: Path) -> None:
    fs = StorageFS.from_url(str(tmp_path))
    for attempt in range(5):
        path = f"{fs.root}/job/chk-{attempt}/_metadata"
        outcomes = _race(fs, path, writers=8)
        winners = [o for o in outcomes if o.startswith("won")]
        assert len(winners) == 1 and outcomes.count("lost") == 7
        assert fs.read_bytes(path) == f"writer-{winners[0][4:]}".encode() * 1000
    # no temp files are left behind by winners or losers
    assert [f.path for f in fs.find(fs.root) if ".tmp-" in f.path] == []


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


def test_existing_file_is_never_overwritten(tmp_path: Path) -> None:
    fs = StorageFS.from_url(str(tmp_path))
    path = f"{fs.root}/job/chk-5/_metadata"
    fs.create_exclusive(path, b"first")
    with pytest.raises(FileExistsError):
        fs.create_exclusive(path, b"second")
    assert fs.read_bytes(path) == b"first"


def test_memory_filesystem_is_exclusive_within_the_process() -> None:
    fs = StorageFS(fsspec.filesystem("memory"), "/excl-test")
    outcomes = _race(fs, "/excl-test/job/_metadata", writers=8)
    assert sorted(outcomes)[:7] == ["lost"] * 7 and len(outcomes) == 8


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
