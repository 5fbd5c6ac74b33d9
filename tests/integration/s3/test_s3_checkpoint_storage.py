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

from sparkpoint.errors import LeaseHeldError, LeaseLostError  # noqa: E402
from sparkpoint.storage.checkpoint_storage import (  # noqa: E402
    FsCheckpointStorage,
    open_job_storage,
)
from sparkpoint.storage.gc import collect_garbage  # noqa: E402
from sparkpoint.storage.ids import DurableCheckpointIDCounter  # noqa: E402
from sparkpoint.storage.lease import JobLease  # noqa: E402

pytestmark = pytest.mark.s3


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
