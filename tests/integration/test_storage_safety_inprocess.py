"""What a finished run leaves in checkpoint storage (retention, layout, garbage), read
from one failure-free in-process run of the keyed aggregate job on the shared session;
and a job whose checkpoints are all damaged (it refuses to start; restore.mode=empty
starts it from scratch).

The damaged-checkpoint fall-back (a corrupt local copy and a corrupt checkpoint in
storage) stays in tests/e2e/test_storage_safety.py: it damages a local snapshot copy the
crashed run left, and in one process the surviving Python workers may still prune that
copy after the crash point; a SIGKILL stops them too. So do the lease scenarios that
need a second process."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline
from sparkpoint.errors import NoValidCheckpointError
from sparkpoint.runtime.executor.state import SubtaskState
from sparkpoint.runtime.status import JobStatus
from sparkpoint.storage.handles import checkpoint_file_entries
from sparkpoint.storage.inspect import verify_checkpoints
from tests.e2e.chaos_oracles import aggregate_updates, as_canonical
from tests.e2e.harness import canonical, read_output
from tests.e2e.storage_support import (
    SNAPSHOT_EVERY_4_EPOCHS,
    chk_dir_ids,
    completed_checkpoints,
    flipped_bytes,
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


# -- nothing valid left ------------------------------------------------------------------

def _aggregate_pipeline(out: Path) -> Pipeline:
    return (Pipeline(AGGREGATE_JOB)
            .source(GeneratorSource("events", keys=50, total_events=20_000, max_records_per_epoch=2_000))
            .stateful(KeyedAggregate(AGGREGATE_OPERATOR, ["key"], "value", value_type="bigint"))
            .sink(ParquetSink(str(out))))


def test_with_no_valid_checkpoint_the_job_refuses_to_start_and_restore_mode_empty_starts_fresh(
        spark, tmp_path: Path) -> None:
    """Seed 003's last step: every retained checkpoint is damaged in storage and no local
    copy is left. The job refuses to start, says how to look and how to start anyway, and
    leaves the committed output as it was ("nothing was started, so nothing was lost");
    restore.mode=empty then starts from scratch and commits the whole output again."""
    out = tmp_path / "out"
    settings = job_settings(tmp_path, AGGREGATE_JOB, **SNAPSHOTS_BY_COUNT)
    assert start(_aggregate_pipeline(out), settings, spark).wait().status is JobStatus.FINISHED
    expected = as_canonical(aggregate_updates(20_000, keys=50, per_epoch=2_000),
                            ["key", "count", "sum", "min", "max", "epoch"])
    assert canonical(read_output(out), drop=()) == expected

    fs, layout = job_storage(str(tmp_path / "checkpoints"), job_name=AGGREGATE_JOB)
    done = completed_checkpoints(fs, layout)
    assert done
    for path in {f.path for data in done.values() for f in state_files(data)}:  # once each
        flipped_bytes(Path(layout.join(path)), at=0)
    shutil.rmtree(tmp_path / "state")

    refused = start(_aggregate_pipeline(out), settings, spark)
    with pytest.raises(NoValidCheckpointError) as e:
        refused.wait()
    message = str(e.value)
    assert re.search(rf"has {len(done)} completed checkpoint\(s\) .* but none restores", message), message
    assert "--set restore.mode=empty" in message and "sparkpoint doctor" in message, message
    assert "Nothing was started, so nothing was lost" in message
    assert canonical(read_output(out), drop=()) == expected, "a refused run must not touch the output"

    from_scratch = tmp_path / "from-scratch"
    fresh = start(_aggregate_pipeline(from_scratch / "out"),
                  job_settings(from_scratch, AGGREGATE_JOB, **{"execution.checkpointing.dir":
                                                               str(tmp_path / "checkpoints"),
                                                               "restore.mode": "empty"}), spark)
    assert fresh.wait().status is JobStatus.FINISHED, fresh.tail()
    assert "starting fresh: restore.mode=empty" in fresh.text, fresh.tail()
    assert canonical(read_output(from_scratch / "out"), drop=()) == expected
