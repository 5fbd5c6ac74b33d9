"""A stop request (REST, CLI, Python) is never dropped: one whose barrier epoch fails
goes back to the head of the queue for after the restore, and one the job never got to
carry out is answered when the job ends, saying how it ended. No Spark: the job is
built, never run; what it would talk to is stubbed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.unit.runtime.unstarted_job import unstarted_job
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus


class EpochFailed(Exception):
    pass


@pytest.fixture
def job(tmp_path) -> JobMaster:
    return unstarted_job(tmp_path)


def _queued(job: JobMaster) -> list:
    out = []
    while not job.savepoints.requests.empty():
        out.append(job.savepoints.requests.get_nowait())
    return out


def test_a_stop_whose_barrier_epoch_fails_goes_back_to_the_head_of_the_queue(job):
    from concurrent.futures import Future

    from sparkpoint.runtime.savepoints import StopEpochs

    def failing_epochs(done, final=True):
        raise EpochFailed("a Python worker died")

    progress = SimpleNamespace(announce=lambda line: None)
    coordinator = SimpleNamespace(stop_scheduler=lambda: None, trigger_checkpoint=lambda forced: Future())
    first = job.stop(savepoint=False)
    second = job.stop(savepoint=True)
    with pytest.raises(EpochFailed):
        job.savepoints.serve(coordinator, progress, StopEpochs(failing_epochs, commit_final=lambda: True))
    assert not first.done(), "the interrupted stop was answered or dropped"
    assert [r.future for r in _queued(job)] == [first, second]


def test_a_stop_the_job_ended_before_is_answered_with_how_it_ended(job):
    job.status.transition(JobStatus.RUNNING)
    job.status.transition(JobStatus.FAILED)
    with_savepoint, without = job.stop(savepoint=True), job.stop(savepoint=False)
    job.savepoints.settle(RuntimeError("restart-strategy.type is none"))
    for fut, what in ((with_savepoint, "a savepoint"), (without, "a last checkpoint")):
        assert str(fut.exception(0)) == (f"job orders ended FAILED before it could stop with {what}: "
                                         "restart-strategy.type is none")
    assert job.savepoints.requests.empty()


def test_a_job_that_finished_first_answers_a_stop_and_refuses_a_stop_with_savepoint(job):
    job.status.transition(JobStatus.RUNNING)
    job.status.transition(JobStatus.FINISHED)
    with_savepoint, without = job.stop(savepoint=True), job.stop(savepoint=False)
    job.savepoints.settle()
    assert without.result(0) is None  # stopped, and its final checkpoint committed the output
    assert "finished (its input ended) before the stop with a savepoint was taken: no savepoint" in str(
        with_savepoint.exception(0))
