"""What a finished run leaves in checkpoint storage (retention, layout, garbage), read
from one failure-free in-process run of the keyed aggregate job on the shared session.

The damaged-checkpoint scenario (a corrupt local copy and a corrupt checkpoint in
storage, then nothing valid) stays in tests/e2e/test_storage_safety.py: it damages a
local snapshot copy the crashed run left, and in one process the surviving Python
workers may still prune that copy after the crash point; a SIGKILL stops them too. So do
the lease scenarios that need a second process."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline
from sparkpoint.runtime.executor.state import SubtaskState
from sparkpoint.runtime.status import JobStatus
from sparkpoint.storage.handles import checkpoint_file_entries
from sparkpoint.storage.inspect import verify_checkpoints
from tests.e2e.storage_support import (
    SNAPSHOT_EVERY_4_EPOCHS,
    chk_dir_ids,
    completed_checkpoints,
    job_storage,
    lineages,
    state_files,
)
from tests.inprocess import job_settings, start

pytestmark = pytest.mark.spark

SNAPSHOTS_BY_COUNT = dict(s.split("=", 1) for s in SNAPSHOT_EVERY_4_EPOCHS)


# -- what a finished run leaves in checkpoint storage ------------------------------------

AGGREGATE_JOB = "totals-job"
AGGREGATE_OPERATOR = "totals"
RETAINED = 2


@dataclass
class Finished:
    root: Path
    completed_ids: list[int]


@pytest.fixture(scope="module")
def finished(spark, tmp_path_factory) -> Finished:
    """One failure-free run that keeps RETAINED checkpoints, snapshots by count (so the
    retained checkpoints always include snapshot files however fast the machine is),
    paced so that it completes more checkpoints than it retains."""
    root = tmp_path_factory.mktemp("finished")
    pipeline = (Pipeline(AGGREGATE_JOB)
                .source(GeneratorSource("events", keys=50, total_events=20_000, max_records_per_epoch=2_000,
                                        rate_per_s=2_500))  # about 8 s: enough checkpoints on any machine
                .stateful(KeyedAggregate(AGGREGATE_OPERATOR, ["key"], "value", value_type="bigint"))
                .sink(ParquetSink(str(root / "out"))))
    run = start(pipeline, job_settings(root, AGGREGATE_JOB, **SNAPSHOTS_BY_COUNT,
                                       **{"execution.checkpointing.num-retained": RETAINED}), spark)
    assert run.wait().status is JobStatus.FINISHED, run.tail()
    return Finished(root, list(run.job.completed_ids))


def test_retention_keeps_num_retained_checkpoints_with_every_file_they_need(finished, tmp_path: Path) -> None:
    fs, layout = job_storage(str(finished.root / "checkpoints"), job_name=AGGREGATE_JOB)
    assert len(finished.completed_ids) >= RETAINED + 3, finished.completed_ids

    done = completed_checkpoints(fs, layout)

    assert sorted(done) == sorted(finished.completed_ids)[-RETAINED:]
    assert chk_dir_ids(fs, layout) == set(done), "subsumed checkpoints leave nothing behind"
    for result in verify_checkpoints(fs, layout, done):
        assert result.ok and result.files_checked > 0, result
    for cid, data in done.items():
        assert {f.path for f in state_files(data)} <= {e.path for e in checkpoint_file_entries(data.handles)}, \
            f"chk-{cid}: the garbage collector and verify see every state file"

    # The oldest retained checkpoint restores on a machine that has nothing local.
    oldest = done[min(done)]
    for participant, lineage in lineages(oldest).items():
        state = SubtaskState(str(tmp_path / "elsewhere"), lineage, fs, layout)
        try:
            store = state.open(lineage.epoch + 1, trust_local=False)
            assert state.report.how == "rebuild" and store.epoch() == oldest.handles["job"]["epoch"], participant
        finally:
            state.close()


def test_state_files_live_under_shared_state_operator_subtask(finished) -> None:
    """Where the layout says (docs/faults.md aims storage faults at these paths):
    `shared/state/<op>/<i>/log/<epoch>-<uuid>.changelog` and
    `shared/state/<op>/<i>/<sha16>-<name>` for the files of a snapshot."""
    fs, layout = job_storage(str(finished.root / "checkpoints"), job_name=AGGREGATE_JOB)
    done = completed_checkpoints(fs, layout)
    assert any(lineage.base is not None for data in done.values() for lineage in lineages(data).values()), \
        "the run uploads snapshots"

    misplaced = sorted(f.path for data in done.values() for f in state_files(data)
                       if not re.fullmatch(rf"shared/state/{AGGREGATE_OPERATOR}/[01]/(log/\d{{12}}-[0-9a-f]{{12}}"
                                           r"\.changelog|[0-9a-f]{16}-[^/]+)", f.path))
    assert misplaced == []


def test_shared_files_no_retained_checkpoint_references_are_collected(finished) -> None:
    """Storage does not grow with the run's length: change logs and snapshot files that
    no retained checkpoint references (subsumed, or superseded by a snapshot before any
    checkpoint took them) are deleted; at the end of a finished run only what the
    retained checkpoints reference is left under `shared/`."""
    fs, layout = job_storage(str(finished.root / "checkpoints"), job_name=AGGREGATE_JOB)
    done = completed_checkpoints(fs, layout)
    referenced = {f.path for data in done.values() for f in state_files(data)}

    shared = {layout.relative(f.path) for f in fs.find(layout.shared)}
    assert referenced <= shared
    assert sorted(shared - referenced) == [], "unreferenced shared files are reclaimed"
