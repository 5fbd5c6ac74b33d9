"""A stop asked for through the REST API (not a signal) that meets an epoch failure is
still carried out after the restart: the stop's own barrier epoch fails, or the request
comes in while the job is failing. `job.stop_with_savepoint` is the method the REST
routes call. In process on the shared local SparkSession; the output is compared with
the batch answer of failure_support.expected_windows."""

from __future__ import annotations


import pytest
from failure_support import Events, ObservedJob, OnThread, Tripwire, expected_windows, settings, wait_until

from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus
from sparkpoint.storage.metadata import decode
from tests.e2e.harness import canonical, read_output

pytestmark = pytest.mark.spark

# Paced: a run spans several 1 s checkpoint intervals however fast epochs run.
PACED = Events(keys=50, total=24_000, per_epoch=2_000, rate_per_s=4_000)


@pytest.fixture(scope="module")
def expected(spark) -> list[tuple]:
    return expected_windows(spark, PACED)


class SavepointEpochFails(ObservedJob):
    """The epoch that carries the stop's savepoint barrier fails, once (what a Python
    worker dying under it looks like to the driver)."""

    trip: Tripwire

    def _setup(self) -> None:
        super()._setup()
        trigger = self.coordinator.trigger_savepoint

        def triggering(target=None, *, terminate=False):
            if terminate and not getattr(self, "tripped", False):  # the savepoint the job stops with
                self.tripped = True
                self.trip.arm()
            return trigger(target, terminate=terminate)

        self.coordinator.trigger_savepoint = triggering


def test_a_rest_stop_with_savepoint_whose_epoch_fails_is_carried_out_after_the_restart(spark, tmp_path, expected):
    trip = Tripwire()
    job = SavepointEpochFails(PACED.pipeline("rest-stop", tmp_path / "out", transform=trip),
                              settings(tmp_path, "rest-stop", []), spark=spark)
    job.trip = trip
    running = OnThread(job)
    wait_until(lambda: getattr(job, "completed_ids", None))
    stop = job.stop_with_savepoint(None, savepoint=True)
    result = running.join()
    assert running.error is None, running.error
    assert stop.done(), "the stop request was never answered"
    savepoint = stop.result(0)
    assert result.status is JobStatus.FINISHED and result.extra["savepoint"] == savepoint
    assert job.status.history.count(JobStatus.FAILING) == 1 and result.restarts == 1
    assert job.epoch + 1 < PACED.total // PACED.per_epoch, "it ran to the end of its input instead of stopping"
    with open(f"{savepoint}/_metadata", "rb") as f:
        assert decode(f.read()).properties.terminate, "the stop's savepoint is recorded as ending its job"

    rerun = JobMaster(PACED.pipeline("rest-stop", tmp_path / "out"),
                      settings(tmp_path, "rest-stop", [], **{"execution.state-recovery.path": savepoint}),
                      spark=spark).run()
    assert rerun.status is JobStatus.FINISHED
    assert canonical(read_output(tmp_path / "out")) == expected


def test_a_rest_stop_accepted_while_the_job_fails_is_carried_out_after_the_restart(spark, tmp_path, expected):
    trip = Tripwire()
    job = ObservedJob(PACED.pipeline("rest-stop-failing", tmp_path / "out", transform=trip),
                      settings(tmp_path, "rest-stop-failing", []), spark=spark)
    stops = []

    def on_status(old, new, error) -> None:
        if new is JobStatus.FAILING and not stops:  # the REST API accepts it: the job is not terminal
            stops.append(job.stop_with_savepoint(None, savepoint=False))

    job.status.add_listener(on_status)
    running = OnThread(job)
    wait_until(lambda: getattr(job, "completed_ids", None))
    trip.arm()  # the next epoch fails: a failover, with the stop asked for meanwhile
    result = running.join()
    assert running.error is None, running.error
    assert len(stops) == 1 and stops[0].done(), "the stop request was never answered"
    assert stops[0].exception(0) is None, stops[0].exception(0)
    assert result.status is JobStatus.FINISHED and result.restarts == 1
    assert job.epoch + 1 < PACED.total // PACED.per_epoch, "it ran to the end of its input instead of stopping"

    rerun = JobMaster(PACED.pipeline("rest-stop-failing", tmp_path / "out"),
                      settings(tmp_path, "rest-stop-failing", []), spark=spark).run()
    assert rerun.status is JobStatus.FINISHED
    assert canonical(read_output(tmp_path / "out")) == expected
