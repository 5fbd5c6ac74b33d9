"""Checkpoint storage on an S3 API (moto server on 127.0.0.1): conditional writes,
the lease, ids, retention and gc behave as on local disk."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "unit" / "storage"))
from storage_support import ManualClock, complete_checkpoint, put  # noqa: E402

from sparkpoint.errors import CheckpointIdCollision, LeaseHeldError, LeaseLostError, MetadataExistsError  # noqa: E402
from sparkpoint.storage.checkpoint_storage import (  # noqa: E402
    FsCheckpointLocation,
    FsCheckpointStorage,
    open_job_storage,
)
from sparkpoint.storage.gc import collect_garbage  # noqa: E402
from sparkpoint.storage.ids import DurableCheckpointIDCounter  # noqa: E402
from sparkpoint.storage.inspect import verify_checkpoints  # noqa: E402
from sparkpoint.storage.lease import JobLease  # noqa: E402

pytestmark = pytest.mark.s3


def test_conditional_put_refuses_an_existing_key(s3_job) -> None:
    fs, layout = s3_job()
    path = layout.metadata(1)
    fs.create_exclusive(path, b"first")
    with pytest.raises(FileExistsError):
        fs.create_exclusive(path, b"second")
    assert fs.read_bytes(path) == b"first"


def test_racing_writers_exactly_one_wins(s3_job) -> None:
    clients = [s3_job()[0] for _ in range(6)]
    layout = s3_job()[1]
    for checkpoint_id in range(1, 4):
        barrier, outcomes = threading.Barrier(len(clients)), []

        def write(i: int) -> None:
            barrier.wait()
            try:
                clients[i].create_exclusive(layout.metadata(checkpoint_id), f"writer-{i}".encode())
                outcomes.append(i)
            except FileExistsError:
                outcomes.append(-1)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(len(clients))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcomes if o >= 0]
        assert len(winners) == 1 and outcomes.count(-1) == len(clients) - 1
        assert clients[0].read_bytes(layout.metadata(checkpoint_id)) == f"writer-{winners[0]}".encode()


def test_checkpoint_life_cycle(s3_job) -> None:
    fs, layout = s3_job()
    storage = FsCheckpointStorage(fs, layout)
    first = complete_checkpoint(storage, 1, {"shared/a.sst": b"a", "chk-{id}/MANIFEST": b"m"})
    second = complete_checkpoint(storage, 2, {"shared/b.sst": b"b"})
    with pytest.raises(CheckpointIdCollision):
        storage.initialize_location(2)
    with pytest.raises(MetadataExistsError):
        storage.commit_metadata(FsCheckpointLocation(2, layout.checkpoint(2)), second)
    assert storage.load_completed() == [first, second]

    storage.discard_completed(1, still_referenced=list(second.handles.values()))
    assert storage.load_completed() == [second]
    assert not fs.exists(layout.join("shared/a.sst")) and fs.exists(layout.join("shared/b.sst"))
    assert verify_checkpoints(fs, layout, [2])[0].ok


def test_ids_continue_past_existing_checkpoints(s3_job) -> None:
    fs, layout = s3_job()
    storage = FsCheckpointStorage(fs, layout)
    complete_checkpoint(storage, 4, {"shared/a.sst": b"a"})
    storage.initialize_location(6)  # no _metadata
    counter = DurableCheckpointIDCounter(fs, layout)
    counter.start()
    assert counter.get_and_increment() == 7
    fs.rm(layout.ids)
    restarted = DurableCheckpointIDCounter(*s3_job())
    restarted.start()
    assert restarted.get_and_increment() == 7


def test_lease_refuses_a_second_deployment_and_fences_the_old_one(s3_job) -> None:
    clock = ManualClock()
    old = JobLease(*s3_job(), run_id="deploy-a", ttl_s=30, clock=ManualClock(clock.now))
    old.acquire()
    with pytest.raises(LeaseHeldError, match="run deploy-a"):
        JobLease(*s3_job(), run_id="deploy-b", ttl_s=30, clock=clock).acquire()
    clock.advance(31)
    new = JobLease(*s3_job(), run_id="deploy-b", ttl_s=30, clock=clock)
    assert new.acquire().token == 2
    with pytest.raises(LeaseLostError, match="fenced out"):
        old.check()


def test_simultaneous_lease_acquisition_has_one_winner(s3_job) -> None:
    contenders = [JobLease(*s3_job(), run_id=f"run-{i}", ttl_s=30) for i in range(4)]
    barrier, outcomes = threading.Barrier(len(contenders)), []

    def acquire(lease: JobLease) -> None:
        barrier.wait()
        try:
            lease.acquire()
            outcomes.append(lease.run_id)
        except LeaseHeldError:
            outcomes.append("refused")

    threads = [threading.Thread(target=acquire, args=(c,)) for c in contenders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("refused") == len(contenders) - 1


def test_gc_uses_object_ages(s3_job) -> None:
    fs, layout = s3_job()
    storage = FsCheckpointStorage(fs, layout)
    complete_checkpoint(storage, 1, {"shared/a.sst": b"a"})
    storage.initialize_location(2)
    put(fs, layout, "chk-2/state/b.sst", b"b")
    put(fs, layout, "shared/orphan.sst", b"o")

    young = collect_garbage(fs, layout, grace_period_s=3600, clock=time.time)
    old = collect_garbage(fs, layout, grace_period_s=3600, clock=lambda: time.time() + 7200)

    assert young.deleted_checkpoints == [] and young.deleted_shared_files == []
    assert old.deleted_checkpoints == [2] and old.deleted_shared_files == ["shared/orphan.sst"]
    assert [c.checkpoint_id for c in storage.load_completed()] == [1]


def test_open_job_storage_on_s3(s3_bucket, s3_options) -> None:
    js = open_job_storage(f"s3://{s3_bucket}", "opened", s3_options, run_id="r1")
    js.lease.acquire()
    js.ids.start()
    checkpoint_id = js.ids.get_and_increment()
    complete_checkpoint(js.checkpoints, checkpoint_id, {"shared/x": b"x"})
    js.close()
    again = open_job_storage(f"s3://{s3_bucket}", "opened", s3_options, run_id="r2")
    assert again.lease.acquire().token == 2  # released cleanly: no wait
    assert [c.checkpoint_id for c in again.checkpoints.load_completed()] == [1]
