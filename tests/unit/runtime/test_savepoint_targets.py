"""A savepoint target asked for through the Python API (`job.trigger_savepoint(target)`,
`job.stop(target=...)`, `job.stop_with_savepoint(target)`) meets the same allow-list as
one asked for over REST or the CLI: a savepoint copies all of the job's state, and the
code that asks may be a notebook cell or an operator's script, not the pipeline.
No Spark: the job is built, never run, and its coordinator is a recorder."""

from __future__ import annotations

import pytest

from tests.unit.runtime.unstarted_job import unstarted_job
from sparkpoint.errors import ConfigError
from sparkpoint.runtime.jobmaster import JobMaster


class RecordingCoordinator:
    def __init__(self) -> None:
        self.savepoints: list[str | None] = []

    def trigger_savepoint(self, target=None, *, terminate=False):
        from concurrent.futures import Future

        self.savepoints.append(target)
        return Future()


@pytest.fixture
def job(tmp_path) -> JobMaster:
    master = unstarted_job(tmp_path, f"execution.checkpointing.savepoint.allowed-targets=[{tmp_path / 'backups'}]")
    master.coordinator = RecordingCoordinator()
    return master


OUTSIDE = ["http://127.0.0.1:1/steal", "{tmp}/elsewhere", "{tmp}/chk/../outside", "memory://x/y"]


@pytest.mark.parametrize("target", OUTSIDE)
def test_the_python_api_takes_a_savepoint_to_a_target_rest_and_the_cli_refuse(job, tmp_path, target):
    target = target.format(tmp=tmp_path)
    with pytest.raises(ConfigError, match="allowed-targets"):
        job.trigger_savepoint(target)
    assert job.coordinator.savepoints == [], "the savepoint was triggered"
    with pytest.raises(ConfigError, match="allowed-targets"):
        job.stop(savepoint=True, target=target)
    with pytest.raises(ConfigError, match="allowed-targets"):
        job.stop_with_savepoint(target)
    assert job.savepoints.requests.empty(), "the stop was queued"
    assert not (tmp_path / "elsewhere").exists()


def test_the_python_api_takes_savepoints_below_the_checkpoint_directory_or_an_allowed_target(job, tmp_path):
    inside = [str(tmp_path / "chk" / "sp-1"), str(tmp_path / "backups" / "sp-2"), None]
    for target in inside:
        job.trigger_savepoint(target)
    assert job.coordinator.savepoints == inside
    for target in inside:
        job.stop(savepoint=True, target=target)
    assert [job.savepoints.requests.get_nowait().target for _ in inside] == inside
