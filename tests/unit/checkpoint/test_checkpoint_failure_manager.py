from __future__ import annotations

import pytest

from sparkpoint.checkpoint import (
    CheckpointFailureManager,
    CheckpointFailureReason as R,
    FailureOutcome,
    TolerableCheckpointFailuresExceeded,
)
from sparkpoint.errors import LeaseLostError


@pytest.fixture
def failed() -> list:
    return []


@pytest.fixture
def fm(failed) -> CheckpointFailureManager:
    return CheckpointFailureManager(3, lambda reason, error: failed.append((reason, error)))


def test_three_consecutive_failures_are_tolerated_and_the_fourth_fails_the_job_once(fm, failed):
    outcomes = [fm.handle_failure(i, R.EXPIRED).outcome for i in (1, 2, 3)]
    assert outcomes == [FailureOutcome.COUNTED] * 3 and failed == []
    verdict = fm.handle_failure(4, R.TASK_ASYNC_FAILURE, OSError("disk"))
    assert (verdict.outcome, verdict.consecutive_failures) == (FailureOutcome.JOB_FAILED, 4)
    [(reason, error)] = failed
    assert reason is R.TASK_ASYNC_FAILURE
    assert isinstance(error, TolerableCheckpointFailuresExceeded)
    assert isinstance(error.__cause__, OSError)
    # counting starts again
    assert fm.consecutive_failures == 0
    assert fm.handle_failure(5, R.EXPIRED).outcome is FailureOutcome.COUNTED
    assert len(failed) == 1


def test_a_success_in_between_resets_the_count(fm, failed):
    for i in (1, 2, 3):
        fm.handle_failure(i, R.EXPIRED)
    fm.handle_success(4)
    for i in (5, 6, 7):
        fm.handle_failure(i, R.EXPIRED)
    assert failed == [] and fm.consecutive_failures == 3


def test_uncounted_reasons_never_count(fm, failed):
    uncounted = [r for r in R if not r.counted and not r.fatal]
    for i, reason in enumerate(uncounted * 3, start=1):
        assert fm.handle_failure(i, reason).outcome is FailureOutcome.NOT_COUNTED
    assert fm.consecutive_failures == 0 and failed == []


def test_a_checkpoint_counts_once_however_many_participants_report_it(fm):
    assert fm.handle_failure(1, R.TASK_ASYNC_FAILURE, participant="a").outcome is FailureOutcome.COUNTED
    assert fm.handle_failure(1, R.TASK_ASYNC_FAILURE, participant="b").outcome is FailureOutcome.ALREADY_COUNTED
    assert fm.consecutive_failures == 1


def test_failures_older_than_the_last_success_are_stale(fm):
    fm.handle_success(10)
    assert fm.handle_failure(9, R.EXPIRED).outcome is FailureOutcome.STALE
    assert fm.handle_failure(10, R.EXPIRED).outcome is FailureOutcome.STALE
    assert fm.consecutive_failures == 0


def test_a_success_older_than_a_failure_leaves_that_failure_counted(fm):
    fm.handle_failure(6, R.EXPIRED)
    fm.handle_success(5)  # concurrent checkpoints: 5 completes after 6 failed
    assert fm.consecutive_failures == 1
    fm.handle_success(7)
    assert fm.consecutive_failures == 0


def test_failures_without_an_id_count_and_reset_on_success(fm):
    fm.handle_failure(None, R.IO_EXCEPTION)
    fm.handle_failure(None, R.IO_EXCEPTION)
    assert fm.consecutive_failures == 2
    fm.handle_success(1)
    assert fm.consecutive_failures == 0


def test_zero_tolerance_fails_on_the_first_counted_failure(failed):
    fm = CheckpointFailureManager(0, lambda reason, error: failed.append(reason))
    fm.handle_failure(1, R.TASK_SYNC_FAILURE)
    assert failed == [R.TASK_SYNC_FAILURE]


def test_lost_lease_fails_the_job_at_once_and_only_once(fm, failed):
    error = LeaseLostError("fenced")
    assert fm.handle_failure(1, R.LEASE_LOST, error).outcome is FailureOutcome.JOB_FAILED
    assert fm.handle_failure(2, R.LEASE_LOST, error).outcome is FailureOutcome.ALREADY_COUNTED
    assert failed == [(R.LEASE_LOST, error)]
    assert fm.consecutive_failures == 0
