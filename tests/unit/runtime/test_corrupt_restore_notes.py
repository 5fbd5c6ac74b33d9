"""After a restore, an epoch whose subtask cannot rebuild the restored state marks that
checkpoint as never to be restored again only when a file failed verification, told
by the exception's type, not by words anywhere in a worker's traceback."""

from __future__ import annotations

from types import SimpleNamespace

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.runtime.restore import RestoreSteps
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
    marked: dict[int, BaseException] = {}
    driver = SimpleNamespace(restored_from=3, coordinator=SimpleNamespace(completed_store=SimpleNamespace(
        all=lambda: [data])), _mark_bad=lambda cid, e: marked.setdefault(cid, e))
    path = d.lineages.for_tasks()[0].changelog[0].file.path
    return driver, path, marked


def test_a_storage_outage_in_the_first_epoch_after_a_restore_does_not_mark_the_checkpoint_corrupt(tmp_path):
    driver, path, marked = _driver(tmp_path)
    error = RuntimeError(TRACEBACK.format(last=f"sparkpoint.errors.StorageError: injected fault: read of {path} failed"))
    RestoreSteps._note_corrupt_restore(driver, error)
    assert marked == {}


def test_a_change_log_failing_verification_after_a_restore_marks_the_checkpoint_corrupt(tmp_path):
    driver, path, marked = _driver(tmp_path)
    error = RuntimeError(TRACEBACK.format(
        last=f"sparkpoint.errors.CorruptSnapshotError: change log {path} (epoch 0) fails verification"))
    RestoreSteps._note_corrupt_restore(driver, error)
    assert list(marked) == [3]
