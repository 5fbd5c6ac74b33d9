"""A restore whose state files cannot be read for a while is not a corrupt checkpoint.

The restore job runs on executors; what it learns comes back to the driver through
Spark. A storage outage during it must reach the driver as the storage failure it is
(the job fails over and restores the same checkpoint once storage answers), while a
file that fails verification must reach it as corruption (the checkpoint is skipped
for an older one). Told apart by type, never by the words in a worker's traceback."""

from __future__ import annotations

import pytest

from sparkpoint.errors import CorruptCheckpointError, StorageError
from sparkpoint.runtime.executor.storage import StorageRef
from sparkpoint.runtime.executor.subtask import RestoreTask
from sparkpoint.runtime.restore import StateRestore
from sparkpoint.state.memory import StateMemory
from tests.unit.runtime.test_executor_state import Driver

pytestmark = pytest.mark.spark


def _restore(spark, d: Driver, storage: StorageRef, executor_root) -> None:
    """The driver's restore step (the real code) with its Spark job on the shared session."""
    state = StateRestore(spark, str(executor_root), storage, StateMemory(), {"totals": d.lineages},
                         d.lineages.max_parallelism, "job", announce=lambda line: None)
    state.rebuild("totals", checkpoint_id=7)


def test_a_storage_outage_while_state_is_restored_is_a_storage_failure_not_a_corrupt_checkpoint(spark, tmp_path):
    d = Driver(tmp_path)
    d.run(tmp_path / "a", ["ann"], [1])
    d.lineages.restore({0: d.lineages.handle(0)[0]})
    outage = StorageRef(d.storage.url, d.storage.job_name, {}, ({"op": "read", "path": "*", "action": "fail"},))
    with pytest.raises(StorageError) as raised:
        _restore(spark, d, outage, tmp_path / "b")
    assert not isinstance(raised.value, CorruptCheckpointError), raised.value
    assert "injected fault" in str(raised.value)


def test_a_change_log_that_fails_verification_while_state_is_restored_is_a_corrupt_checkpoint(spark, tmp_path):
    d = Driver(tmp_path)
    d.run(tmp_path / "a", ["ann"], [1])
    d.lineages.restore({0: d.lineages.handle(0)[0]})
    entry = d.lineages.for_tasks()[0].changelog[0]
    (tmp_path / "checkpoints" / "job" / entry.file.path).write_bytes(b"x" * entry.file.size)
    with pytest.raises(CorruptCheckpointError, match=r"checkpoint 7: .*fails verification"):
        _restore(spark, d, d.storage, tmp_path / "b")
