"""After a restore, an epoch whose subtask cannot rebuild the restored state marks that
checkpoint as never to be restored again only when a file failed verification, told
by the exception's type, not by words anywhere in a worker's traceback."""

from __future__ import annotations

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.runtime.restore import Restorer
from tests.unit.runtime.test_executor_state import Driver

TRACEBACK = """An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/x/sparkpoint/runtime/executor/state.py", line 212, in _fetch
    raise CorruptSnapshotError(f"change log {{c.file.path}} (epoch {{c.epoch}}) is missing from checkpoint "
  File "/x/sparkpoint/faults/storage.py", line 281, in _inject
    raise StorageError(f"injected fault: {{op.value}} of {{path}} failed (rule {{rule.name}})")
{last}
 SQLSTATE: 38000"""


def _driver(tmp_path):
    d = Driver(tmp_path)
    d.run(tmp_path / "a", ["ann"], [1])
    handle = d.lineages.handle(0)[0]
    data = CompletedCheckpointData("job", 3, 0, 0, {"job": {"epoch": 0}, "state:totals/0": handle})
    # Only what noting a failure uses: which checkpoint was restored, and the retained ones.
    restorer = Restorer(job_name="job", settings=None, storage=None, gateway=None, position=None, epoch_plans=None,
                        sources={}, sinks={}, state=None, faults=None, announce=lambda line: None)
    restorer.restored_from = 3
    path = d.lineages.for_tasks()[0].changelog[0].file.path
    return restorer, [data], path


def test_a_storage_outage_in_the_first_epoch_after_a_restore_does_not_mark_the_checkpoint_corrupt(tmp_path):
    restorer, retained, path = _driver(tmp_path)
    error = RuntimeError(TRACEBACK.format(last=f"sparkpoint.errors.StorageError: injected fault: read of {path} failed"))
    restorer.note_failure(error, retained)
    assert restorer.bad_checkpoints == {}


def test_a_change_log_failing_verification_after_a_restore_marks_the_checkpoint_corrupt(tmp_path):
    restorer, retained, path = _driver(tmp_path)
    error = RuntimeError(TRACEBACK.format(
        last=f"sparkpoint.errors.CorruptSnapshotError: change log {path} (epoch 0) fails verification"))
    restorer.note_failure(error, retained)
    assert list(restorer.bad_checkpoints) == [3]
