"""A task's retry is recognised only when its input is provably the same: after a
failover the driver plans the same epoch numbers again over other slices (a
rate-limited source has more by then), and a local store left by the failed attempt
must never stand in for the new rows. In-process, on the shared SparkSession."""

from __future__ import annotations

import pytest
from failure_support import Events, ObservedJob, expected_windows, settings

from sparkpoint import ParquetSink
from sparkpoint.runtime.status import JobStatus
from tests.e2e.harness import canonical, read_output

pytestmark = pytest.mark.spark

# ~6 s of paced input; the first plan takes 0.5 s worth (1 000 records), the one after
# the failover the full epoch (4 000), so epoch 0 covers another slice the second time.
PACED = Events(total=24_000, rate_per_s=4_000)


class StagingFailsOnce(ParquetSink):
    """Epoch 0's output cannot be staged the first time: the subtasks had already
    committed epoch 0 in their local stores, then the job fails over."""

    failed = False

    def stage_epoch(self, epoch, handles):
        if epoch == 0 and not StagingFailsOnce.failed:
            StagingFailsOnce.failed = True
            raise OSError("injected fault: staging epoch 0 failed")
        super().stage_epoch(epoch, handles)


def test_after_a_sink_failure_in_epoch_0_the_fresh_start_applies_the_new_slice_of_a_rate_limited_source(
        spark, tmp_path):
    out = tmp_path / "out"
    pipeline = PACED.pipeline("stale-retry", out)
    pipeline.sink(StagingFailsOnce(str(out)))
    job = ObservedJob(pipeline, settings(tmp_path, "stale-retry", []), spark=spark)
    result = job.run()
    assert StagingFailsOnce.failed and job.restarts == 1
    assert result.status is JobStatus.FINISHED
    got = canonical(read_output(out))
    expected = expected_windows(spark, PACED)
    assert sum(r[3] for r in got) == PACED.total, "records lost or counted twice"
    assert got == expected
