"""The contract every checkpoint-storage implementation keeps, run against each of them:
local disk, fsspec's `memory://` filesystem and S3 (the run's shared S3 API server).

One test class, `TestCheckpointStorageContract`, holds the behaviours; the `backend`
fixture is parametrized per implementation (as Flink's `FileSystemBehaviorTestSuite` and
Spark's `StateStoreSuiteBase` do), so a new backend gets the whole suite by adding one
parameter. Each client the fixture opens is a fresh one on the same root, the way a
second process or a restarted run sees storage.

Behaviours (each asserts what a user of the checkpoints sees):

- listing sees what was written, from another client; deleting is idempotent
- an atomic write replaces the whole file: a concurrent reader sees the old bytes or the
  new, never a torn file
- exclusive create refuses a second writer and keeps the first one's bytes; of racing
  writers exactly one wins
- stage and commit: a checkpoint's files and `_metadata` are what a restarted run loads
- a staged checkpoint whose `_metadata` was never written (a crash) is never loaded, and
  its id is not handed out again
- re-committing the same checkpoint (a retry after a crash) is refused and the first
  commit stays the one that is loaded
- discarding a subsumed checkpoint removes its files but keeps shared files a retained
  checkpoint still references; discarding an aborted checkpoint removes what only it
  named; discarding a crashed run's location twice is harmless
- checkpoint ids continue past every checkpoint directory after a restart, also when the
  ids file is lost
- the job lease: a second deployment is refused while the first holds it; once it
  expired the second takes over with a higher token and the first can no longer commit;
  of deployments starting at once exactly one gets it
- faults sit at the seam as a wrapper (`FaultyStorageFS`): a failed `_metadata` write
  leaves the checkpoint not completed and the next one completes; a torn upload is found
  by verification
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from sparkpoint.checkpoint.interfaces import SupportsHighestCheckpointId
from sparkpoint.errors import (
    CheckpointIdCollision,
    LeaseHeldError,
    LeaseLostError,
    MetadataExistsError,
    StorageError,
)
from sparkpoint.faults import FaultyStorageFS
from sparkpoint.storage.checkpoint_storage import FsCheckpointLocation, FsCheckpointStorage
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.ids import DurableCheckpointIDCounter
from sparkpoint.storage.inspect import verify_checkpoints
from sparkpoint.storage.layout import JobLayout
from sparkpoint.storage.lease import JobLease, read_current_lease
from tests.unit.storage.storage_support import ManualClock, complete_checkpoint, put

SST_A, SST_B, SST_C = ("shared/state/counts/0/a-000001.sst", "shared/state/counts/0/b-000002.sst",
                       "shared/state/counts/0/c-000003.sst")


@dataclass
class Backend:
    """One storage implementation under test: `client()` opens a new client on the
    job's root, as another process would."""

    name: str
    client: Callable[[], StorageFS]
    job: str = "job"

    def layout(self, fs: StorageFS) -> JobLayout:
        return JobLayout(f"{fs.root}/{self.job}")

    def storage(self, fs: StorageFS | None = None) -> FsCheckpointStorage:
        fs = fs or self.client()
        return FsCheckpointStorage(fs, self.layout(fs))


def _local(tmp_path: Path) -> Backend:
    root = str(tmp_path / "checkpoints")
    return Backend("local", lambda: StorageFS.from_url(root))


def _memory(tmp_path: Path) -> Backend:
    # fsspec's memory filesystem is one per process: a root of its own per test.
    root = f"memory://contract-{uuid.uuid4().hex}"
    return Backend("memory", lambda: StorageFS.from_url(root))


def _s3(request: pytest.FixtureRequest) -> Backend:
    bucket = request.getfixturevalue("s3_bucket")
    server = request.getfixturevalue("s3_server")
    # No cached client: each StorageFS is a client of its own, like a separate process.
    options = {**server.storage_options(), "skip_instance_cache": True}
    return Backend("s3", lambda: StorageFS.from_url(f"s3://{bucket}", storage_options=options))


@pytest.fixture(params=["local", "memory", pytest.param("s3", marks=pytest.mark.s3)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "local":
        yield _local(tmp_path)
    elif request.param == "memory":
        yield _memory(tmp_path)
    else:
        yield _s3(request)


def _race(clients: list[StorageFS], path: str) -> list[int]:
    """Every client creates `path` exclusively at once; returns the winners' indexes."""
    barrier, winners = threading.Barrier(len(clients)), []

    def write(i: int) -> None:
        barrier.wait()
        try:
            clients[i].create_exclusive(path, f"writer-{i}".encode() * 1000)
            winners.append(i)
        except FileExistsError:
            pass

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return winners


class TestCheckpointStorageContract:
    # -- files ---------------------------------------------------------------------------
    def test_listing_sees_what_was_written(self, backend: Backend, tmp_path: Path) -> None:
        fs = backend.client()
        layout = backend.layout(fs)
        local = tmp_path / "000007.sst"
        local.write_bytes(b"s" * 3000)
        fs.write_atomic(layout.join("chk-1/state/MANIFEST"), b"manifest")
        fs.create_exclusive(layout.join("chk-1/_started"), b"started")
        fs.put_file(str(local), layout.join("shared/000007.sst"))

        other = backend.client()
        assert other.ls(layout.root) == ["chk-1", "shared"]
        assert other.ls(layout.join("chk-1")) == ["_started", "state"]
        found = {f.path.rsplit(f"/{backend.job}/", 1)[1]: f.size for f in other.find(layout.root)}
        assert found == {"chk-1/_started": 7, "chk-1/state/MANIFEST": 8, "shared/000007.sst": 3000}
        assert other.read_bytes(layout.join("shared/000007.sst")) == b"s" * 3000
        assert other.ls(layout.join("chk-9")) == [] and other.find(layout.join("chk-9")) == []

    def test_deleting_is_seen_by_others_and_idempotent(self, backend: Backend) -> None:
        fs = backend.client()
        layout = backend.layout(fs)
        fs.write_atomic(layout.join("chk-1/a"), b"a")
        fs.write_atomic(layout.join("chk-1/b/c"), b"c")
        other = backend.client()
        assert other.exists(layout.join("chk-1/a"))
        fs.rm(layout.join("chk-1"), recursive=True)
        fs.rm(layout.join("chk-1"), recursive=True)  # deletes are retried
        assert not other.exists(layout.join("chk-1/a")) and other.find(layout.root) == []

    def test_an_atomic_write_or_upload_is_never_seen_torn(self, backend: Backend, tmp_path: Path) -> None:
        fs = backend.client()
        path = backend.layout(fs).join("ids")
        versions = [bytes([65 + v]) * 200_000 for v in range(3)]
        fs.write_atomic(path, versions[0])
        local = tmp_path / "upload"
        reader, seen, done = backend.client(), [], threading.Event()

        def read() -> None:
            while not done.is_set():
                seen.append(reader.read_bytes(path))

        thread = threading.Thread(target=read)
        thread.start()
        try:
            for i in range(30):
                data = versions[i % 3][: 200_000 - i]
                if i % 2:
                    local.write_bytes(data)
                    fs.put_file(str(local), path)
                else:
                    fs.write_atomic(path, data)
        finally:
            done.set()
            thread.join()
        whole = {v[: 200_000 - i] for i in range(30) for v in versions} | {versions[0]}
        assert seen and all(s in whole for s in seen), "a reader saw a torn file"
        assert reader.read_bytes(path) == versions[29 % 3][: 200_000 - 29]

    def test_exclusive_create_refuses_a_second_writer_and_keeps_the_first(self, backend: Backend) -> None:
        first, second = backend.client(), backend.client()
        path = backend.layout(first).metadata(5)
        first.create_exclusive(path, b"first")
        with pytest.raises(FileExistsError):
            second.create_exclusive(path, b"second")
        with pytest.raises(FileExistsError):
            first.create_exclusive(path, b"first again")
        assert second.read_bytes(path) == b"first"

    def test_of_racing_exclusive_writers_exactly_one_wins(self, backend: Backend) -> None:
        clients = [backend.client() for _ in range(6)]
        layout = backend.layout(clients[0])
        for checkpoint_id in range(1, 4):
            path = layout.metadata(checkpoint_id)
            winners = _race(clients, path)
            assert len(winners) == 1, winners
            assert clients[-1].read_bytes(path) == f"writer-{winners[0]}".encode() * 1000
        # neither winners nor losers leave temp files behind
        assert [f.path for f in clients[0].find(layout.root) if ".tmp-" in f.path] == []

    # -- checkpoints -----------------------------------------------------------------------
    def test_committed_checkpoints_are_what_a_restarted_run_loads(self, backend: Backend) -> None:
        storage = backend.storage()
        first = complete_checkpoint(storage, 1, {SST_A: b"a", "chk-{id}/state/MANIFEST": b"m1"})
        second = complete_checkpoint(storage, 2, {SST_B: b"b", "chk-{id}/state/MANIFEST": b"m2"})
        restarted = backend.storage()
        assert restarted.load_completed() == [first, second]
        assert [r.ok for r in verify_checkpoints(restarted.fs, restarted.layout)] == [True, True]

    def test_a_checkpoint_staged_but_never_committed_is_not_loaded_nor_its_id_reused(
            self, backend: Backend) -> None:
        storage = backend.storage()
        complete_checkpoint(storage, 1, {SST_A: b"a"})
        location = storage.initialize_location(2)
        storage.fs.write_atomic(location.path + "/state/partial.sst", b"x")  # then the crash
        restarted = backend.storage()
        assert [c.checkpoint_id for c in restarted.load_completed()] == [1]
        assert isinstance(restarted, SupportsHighestCheckpointId)
        assert restarted.highest_checkpoint_id() == 2
        with pytest.raises(CheckpointIdCollision, match="chk-2 already exists"):
            restarted.initialize_location(2)
        # The orphan is discarded (twice: the discard is retried) and the job goes on.
        restarted.discard_location(2)
        restarted.discard_location(2)
        assert not restarted.fs.exists(location.path)
        third = complete_checkpoint(restarted, 3, {SST_B: b"b"})
        assert [c.checkpoint_id for c in backend.storage().load_completed()] == [1, 3]
        assert backend.storage().load_completed()[-1] == third

    def test_committing_the_same_checkpoint_again_is_refused_and_the_first_commit_stays(
            self, backend: Backend) -> None:
        storage = backend.storage()
        original = complete_checkpoint(storage, 5, {SST_A: b"a"})
        location = FsCheckpointLocation(5, storage.layout.checkpoint(5))
        retried = backend.storage()  # the retry after a crash comes from a new run
        changed = type(original)(original.job_name, 5, 99, 100, {"source:gen": {"offset": 99}})
        with pytest.raises(MetadataExistsError, match="chk-5/_metadata already exists"):
            retried.commit_metadata(location, changed)
        with pytest.raises(MetadataExistsError):
            storage.commit_metadata(location, original)
        assert backend.storage().load_completed() == [original]

    def test_discarding_a_subsumed_checkpoint_keeps_what_a_retained_one_references(
            self, backend: Backend) -> None:
        storage = backend.storage()
        fs, layout = storage.fs, storage.layout
        complete_checkpoint(storage, 1, {SST_A: b"a", SST_B: b"b", "chk-{id}/state/MANIFEST": b"m"})
        second = complete_checkpoint(storage, 2, {SST_B: b"b", SST_C: b"c"})

        storage.discard_completed(1, still_referenced=list(second.handles.values()))

        other = backend.client()
        assert not other.exists(layout.checkpoint(1))
        assert not other.exists(layout.join(SST_A))  # only checkpoint 1 used it
        assert other.exists(layout.join(SST_B)) and other.exists(layout.join(SST_C))
        assert backend.storage().load_completed() == [second]
        assert verify_checkpoints(fs, layout, [2])[0].ok

    def test_discarding_an_aborted_checkpoint_keeps_what_others_reference(self, backend: Backend) -> None:
        storage = backend.storage()
        retained = complete_checkpoint(storage, 1, {SST_A: b"a"})
        location = storage.initialize_location(2)
        handles = [{"kind": "rocksdb", "files": [put(storage.fs, storage.layout, rel, data) for rel, data in
                                                 [(SST_A, b"a"), (SST_B, b"b"), ("chk-2/state/MANIFEST", b"m")]]}]
        storage.discard_aborted(2, handles, still_referenced=list(retained.handles.values()))
        other = backend.client()
        assert not other.exists(location.path)
        assert not other.exists(storage.layout.join(SST_B))  # only the aborted one named it
        assert other.read_bytes(storage.layout.join(SST_A)) == b"a"
        assert backend.storage().load_completed() == [retained]
        assert verify_checkpoints(other, backend.layout(other), [1])[0].ok

    def test_checkpoint_ids_are_never_handed_out_twice_across_restarts(self, backend: Backend) -> None:
        storage = backend.storage()
        complete_checkpoint(storage, 4, {SST_A: b"a"})
        storage.initialize_location(6)  # a crashed run's leftover, no `_metadata`
        counter = DurableCheckpointIDCounter(storage.fs, storage.layout)
        counter.start()
        assert [counter.get_and_increment() for _ in range(2)] == [7, 8]
        fs = backend.client()
        fs.rm(backend.layout(fs).ids)  # the ids file is lost
        restarted = DurableCheckpointIDCounter(fs, backend.layout(fs))
        restarted.start()
        assert restarted.get_and_increment() == 7  # past every directory: 7 and 8 were never used
        again = DurableCheckpointIDCounter(fs, backend.layout(fs))
        again.start()
        assert again.get_and_increment() == 8

    def test_the_lease_refuses_a_second_deployment_and_fences_out_an_expired_one(
            self, backend: Backend) -> None:
        clock = ManualClock()

        def deployment(run: str, clock: ManualClock) -> tuple[JobLease, FsCheckpointStorage]:
            fs = backend.client()
            lease = JobLease(fs, backend.layout(fs), run_id=run, ttl_s=30, clock=clock)
            return lease, FsCheckpointStorage(fs, backend.layout(fs), lease=lease, clock=clock)

        # The old run's clock stands still: it believes its lease is fresh (a paused
        # process), and only the fencing token can stop it.
        old, old_storage = deployment("deploy-a", ManualClock(clock.now))
        old.acquire()
        clock.advance(10)
        with pytest.raises(LeaseHeldError, match="run deploy-a"):
            deployment("deploy-b", clock)[0].acquire()
        clock.advance(31)
        new, new_storage = deployment("deploy-b", clock)
        assert new.acquire().token == 2
        fs = backend.client()
        assert read_current_lease(fs, backend.layout(fs)).run_id == "deploy-b"
        with pytest.raises(LeaseLostError, match="fenced out"):
            old.check()
        with pytest.raises(LeaseLostError, match="fenced out"):
            complete_checkpoint(old_storage, 1, {SST_A: b"old"})
        taken_over = complete_checkpoint(new_storage, 2, {SST_B: b"new"})
        assert backend.storage().load_completed() == [taken_over]

    def test_of_deployments_starting_at_once_exactly_one_gets_the_lease(self, backend: Backend) -> None:
        contenders = [JobLease(fs, backend.layout(fs), run_id=f"run-{i}", ttl_s=30)
                      for i, fs in enumerate(backend.client() for _ in range(4))]
        barrier, winners = threading.Barrier(len(contenders)), []

        def acquire(lease: JobLease) -> None:
            barrier.wait()
            try:
                lease.acquire()
                winners.append(lease.run_id)
            except LeaseHeldError:
                pass

        threads = [threading.Thread(target=acquire, args=(c,)) for c in contenders]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(winners) == 1, winners
        fs = backend.client()
        assert read_current_lease(fs, backend.layout(fs)).run_id == winners[0]

    # -- faults, injected at the seam --------------------------------------------------------
    def test_a_failed_metadata_write_leaves_the_checkpoint_not_completed(self, backend: Backend) -> None:
        inner = backend.client()
        faulty = FaultyStorageFS(inner, [{"op": "create_exclusive", "path": "*/_metadata",
                                          "action": "fail", "times": 1}])
        storage = FsCheckpointStorage(faulty, backend.layout(inner))
        with pytest.raises(StorageError, match="injected fault"):
            complete_checkpoint(storage, 1, {SST_A: b"a"})
        second = complete_checkpoint(storage, 2, {SST_B: b"b"})
        assert backend.storage().load_completed() == [second]

    def test_a_torn_upload_is_found_by_verification(self, backend: Backend) -> None:
        inner = backend.client()
        faulty = FaultyStorageFS(inner, [{"op": "write", "path": "*/shared/*", "action": "truncate"}])
        storage = FsCheckpointStorage(faulty, backend.layout(inner))
        complete_checkpoint(storage, 1, {"shared/a.sst": b"abcdef"})
        fresh = backend.client()
        [result] = verify_checkpoints(fresh, backend.layout(fresh))
        assert result.problems == ["state:counts/0: shared/a.sst has 3 bytes, the checkpoint recorded 6"]
