"""The job lease (seed 003: two deployments on one directory). Time is a manual clock."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import pytest
from storage_support import ManualClock, complete_checkpoint, local_job

from sparkpoint.errors import LeaseHeldError, LeaseLapsedError, LeaseLostError, StorageError
from sparkpoint.faults import FaultyStorageFS
from sparkpoint.storage.checkpoint_storage import FsCheckpointStorage
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout
from sparkpoint.storage.lease import JobLease, LeaseKeeper, lease_tokens, read_current_lease


def lease(job: tuple[StorageFS, JobLayout], clock: ManualClock, run: str, **kw) -> JobLease:
    fs, layout = job
    return JobLease(fs, layout, run_id=run, host=f"host-{run}", pid=100, ttl_s=30, clock=clock, **kw)


def test_second_run_is_refused_with_who_holds_it_and_how_to_take_over(job, clock) -> None:
    lease(job, clock, "a").acquire()
    clock.advance(10)
    with pytest.raises(LeaseHeldError) as refused:
        lease(job, clock, "b").acquire()
    message = str(refused.value)
    for expected in ("run a", "host host-a", "pid 100", "since 2027-01-15T08:00:00Z",
                     "still running (it renewed its lease 10 s ago", "sparkpoint stop --checkpoint-dir",
                     "--job job", "kill -TERM 100 on host host-a", "another job name"):
        assert expected in message


def test_heartbeats_keep_the_lease(job, clock) -> None:
    holder = lease(job, clock, "a")
    holder.acquire()
    for _ in range(5):
        clock.advance(20)
        holder.heartbeat()
    with pytest.raises(LeaseHeldError):
        lease(job, clock, "b").acquire()
    holder.check()


def test_released_lease_is_taken_at_once(job, clock) -> None:
    holder = lease(job, clock, "a")
    holder.acquire()
    holder.release()
    assert lease(job, clock, "b").acquire().token == 2


def test_fenced_out_holder_cannot_commit_or_heartbeat(job, clock, tmp_path: Path) -> None:
    old_clock = ManualClock(clock.now)
    old = lease(job, old_clock, "old")  # its clock stands still: it believes it is fine
    old.acquire()
    clock.advance(31)
    lease(job, clock, "new").acquire()

    storage = FsCheckpointStorage(*job, lease=old)
    with pytest.raises(LeaseLostError, match="fenced out.*run new .*token 2"):
        complete_checkpoint(storage, 1, {"shared/x.sst": b"x"})
    assert not job[0].exists(job[1].metadata(1))
    with pytest.raises(LeaseLostError):
        old.heartbeat()
    with pytest.raises(LeaseLostError):  # nor delete what the new run may restore from
        storage.discard_completed(0, still_referenced=[])
    old.release()  # must not un-release the new holder's lease
    assert read_current_lease(*job).run_id == "new" and not read_current_lease(*job).released


def test_holder_that_cannot_renew_stops_committing_before_anyone_may_take_over(job, clock) -> None:
    fs, layout = job
    faulty = FaultyStorageFS(fs)
    holder = JobLease(faulty, layout, run_id="a", ttl_s=30, clock=clock)
    holder.acquire()
    faulty.add_rule({"op": "write", "path": "*/_lease/*", "action": "fail"})
    clock.advance(20)
    with pytest.raises(StorageError):
        holder.heartbeat()
    holder.check()  # 20 s < 3/4 of ttl: still trusted
    clock.advance(3)
    with pytest.raises(LeaseLapsedError, match="pauses committing"):
        holder.check()
    with pytest.raises(LeaseHeldError):  # a contender still waits for the full ttl
        lease(job, clock, "b").acquire()


def test_a_storage_outage_longer_than_the_ttl_only_pauses_commits_and_the_run_takes_its_lease_back(
        job, clock) -> None:
    """An outage of 2x the ttl with nobody taking over must not end the run."""
    fs, layout = job
    faulty = FaultyStorageFS(fs)
    holder = JobLease(faulty, layout, run_id="a", ttl_s=30, clock=clock)
    keeper = LeaseKeeper(holder, on_lost=lambda e: lost.append(e))
    lost: list = []
    holder.acquire()
    faulty.add_rule({"op": "write", "path": "*/_lease/*", "action": "fail", "name": "outage"})
    faulty.add_rule({"op": "create_exclusive", "path": "*/_lease/*", "action": "fail", "name": "outage2"})
    for _ in range(8):  # 60 s of failed renewals
        clock.advance(7.5)
        assert keeper.renew_once()
    with pytest.raises(LeaseLapsedError):
        holder.check()
    faulty.remove_rule("outage")
    faulty.remove_rule("outage2")
    assert keeper.renew_once() and not lost
    holder.check()  # commits again
    assert read_current_lease(fs, layout).run_id == "a" and holder.token == 2


def test_after_an_outage_a_proven_takeover_fences_the_old_run(job, clock) -> None:
    fs, layout = job
    faulty = FaultyStorageFS(fs)
    holder = JobLease(faulty, layout, run_id="a", ttl_s=30, clock=clock)
    lost: list = []
    keeper = LeaseKeeper(holder, on_lost=lost.append)
    holder.acquire()
    faulty.add_rule({"op": "any", "path": "*/_lease*", "action": "fail", "name": "outage"})
    clock.advance(31)
    assert keeper.renew_once()
    lease(job, clock, "b").acquire()  # the ttl ran out: b takes over with token 2
    faulty.remove_rule("outage")
    assert not keeper.renew_once()
    assert lost and "fenced out" in str(lost[0])
    with pytest.raises(LeaseLostError):
        holder.check()
    assert read_current_lease(fs, layout).run_id == "b"


def test_a_holder_in_another_pid_namespace_with_our_hostname_is_not_declared_dead(job, clock) -> None:
    fs, layout = job

    def run(name: str, pid: int, pidns: str) -> JobLease:
        return JobLease(fs, layout, run_id=name, host="same-host", pid=pid, ttl_s=30, clock=clock, pidns=pidns)

    run("other", 999_999, "pid:[1]").acquire()  # no such pid in this test's namespace
    with pytest.raises(LeaseHeldError):
        run("me", 100, "pid:[2]").acquire()
    # ...while in the same namespace a dead pid is taken over at once.
    assert run("me2", 100, "pid:[1]").acquire().token == 2


def test_the_trust_window_runs_on_the_monotonic_clock(job, clock) -> None:
    mono = ManualClock(0)
    holder = JobLease(job[0], job[1], run_id="a", ttl_s=30, clock=clock, monotonic=mono)
    holder.acquire()
    clock.advance(-3600)  # an NTP step backwards does not extend the trust window
    mono.advance(23)
    with pytest.raises(LeaseLapsedError):
        holder.check()


def test_old_token_records_are_pruned(job, clock) -> None:
    for i in range(5):
        lease(job, clock, f"run{i}").acquire()
        clock.advance(31)
    assert lease_tokens(*job) == [4, 5]


def test_keeper_calls_on_lost_once_fenced(job, clock) -> None:
    old = lease(job, ManualClock(clock.now), "old")
    old.acquire()
    lost: list[LeaseLostError] = []
    keeper = LeaseKeeper(old, on_lost=lost.append)
    assert keeper.renew_once()
    clock.advance(31)
    lease(job, clock, "new").acquire()
    assert not keeper.renew_once()
    assert len(lost) == 1 and "fenced out" in str(lost[0])


def test_keeper_thread_reports_loss(job, clock) -> None:
    old = lease(job, ManualClock(clock.now), "old")
    old.acquire()
    clock.advance(31)
    lease(job, clock, "new").acquire()
    lost = threading.Event()
    keeper = LeaseKeeper(old, on_lost=lambda e: lost.set(), interval_s=0.01)
    keeper.start()
    try:
        assert lost.wait(10)
    finally:
        keeper.stop()


def _acquire_in_process(root: str, run: str, start, results) -> None:
    fs, layout = local_job(Path(root))
    start.wait()  # all processes are imported and ready: now they race
    try:
        JobLease(fs, layout, run_id=run, ttl_s=30).acquire()
        results.put(f"won:{run}")
    except LeaseHeldError as e:
        results.put(f"refused:{e}")


@pytest.mark.parametrize("previous", ["none", "expired"])
def test_two_processes_starting_at_once_exactly_one_wins(tmp_path: Path, previous: str) -> None:
    if previous == "expired":
        JobLease(*local_job(tmp_path), run_id="crashed", ttl_s=30, clock=lambda: 1_000.0).acquire()
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_acquire_in_process, args=(str(tmp_path), f"run{i}", start, results))
             for i in range(2)]
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert outcomes[0].startswith("refused:") and outcomes[1].startswith("won:")
    winner = outcomes[1][4:]
    assert f"run {winner}" in outcomes[0]
    assert read_current_lease(*local_job(tmp_path)).run_id == winner


def test_loser_of_the_token_race_is_refused_naming_the_winner(job, clock) -> None:
    """Deterministic interleaving: both runs saw no live lease; the winner creates token 1
    between the loser's look and the loser's exclusive create."""
    fs, layout = job
    winner = lease(job, clock, "winner")

    class WinnerFirst(FaultyStorageFS):
        def create_exclusive(self, path: str, data: bytes) -> None:
            winner.acquire()
            super().create_exclusive(path, data)

    loser = JobLease(WinnerFirst(fs), layout, run_id="loser", ttl_s=30, clock=clock)
    with pytest.raises(LeaseHeldError, match="held by run winner"):
        loser.acquire()
    assert winner.token == 1 and not loser.held
    winner.check()
