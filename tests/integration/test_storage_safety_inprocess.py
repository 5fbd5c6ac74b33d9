"""Restarts and bad disks cannot corrupt a job: crashed and restored inside the test
process (tests/inprocess.py) on the shared SparkSession, with real RocksDB stores and real
checkpoint files. Output is compared with the batch answer (failure_support.expected_windows).

What a finished run leaves in checkpoint storage (retention, layout, garbage) is read
from one failure-free in-process run of the keyed aggregate job.

The lease scenarios that need a second process (two deployments at once, a SIGKILLed
holder taken over at once because its pid is gone) stay in tests/e2e/test_storage_safety.py."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from failure_support import Events, expected_windows

from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline
from sparkpoint.errors import CorruptCheckpointError, NoValidCheckpointError
from sparkpoint.runtime.executor.state import SubtaskState, job_local_root, subtask_dir
from sparkpoint.runtime.status import JobStatus
from sparkpoint.state.snapshot import SnapshotFile, snapshot_files
from sparkpoint.storage.handles import checkpoint_file_entries
from sparkpoint.storage.inspect import verify_checkpoints
from tests.e2e.harness import canonical, read_output
from tests.e2e.storage_support import (
    SNAPSHOT_EVERY_4_EPOCHS,
    bad_magic,
    changelogs_only_in,
    chk_dir_ids,
    completed_checkpoints,
    flipped_bytes,
    job_storage,
    lineages,
    state_files,
)
from tests.inprocess import CrashPoint, job_settings, restart, start

pytestmark = pytest.mark.spark

# Paced: the crash point needs a run that spans several checkpoints (two completed ones
# with a change log between them), however fast this machine runs epochs (about 12 s).
EVENTS = Events(rate_per_s=5_000)
OPERATOR = "windows"
SNAPSHOTS_BY_COUNT = dict(s.split("=", 1) for s in SNAPSHOT_EVERY_4_EPOCHS)


@pytest.fixture(scope="module")
def expected(spark) -> list[tuple]:
    return expected_windows(spark, EVENTS)


def _replace_with(path: Path, damage) -> None:
    """Damage a copy: the local recovery copy hard-links files with the live DB, and the
    test means to damage exactly this one."""
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data)
    damage(path)


@dataclass(frozen=True)
class _Damage:
    """Where seed 003's two corruptions go, chosen from what the crashed run left."""

    latest: int
    older: int
    victim: SnapshotFile  # in storage; only `latest` references it
    local_sst: Path  # in subtask 0's local recovery copy of the snapshot `older` is based on


def _damage_plan(local_root: str, fs, layout) -> _Damage | None:
    """None until the two newest completed checkpoints are such that (a) subtask 0 of
    the older one is based on a snapshot this executor still holds locally and (b) the
    latest references a change log of an epoch after the older one's."""
    try:
        done = completed_checkpoints(fs, layout)
    except (FileNotFoundError, CorruptCheckpointError):
        return None  # a subsumed checkpoint was being deleted while we listed
    if len(done) < 2:
        return None
    latest, older = sorted(done)[-1], sorted(done)[-2]
    base = lineages(done[older])[f"state:{OPERATOR}/0"]
    copy = Path(subtask_dir(local_root, OPERATOR, 0)) / f"snap-{base.base_epoch}"
    ssts = sorted(f.name for f in (snapshot_files(base.base) if base.base is not None else [])
                  if f.name.endswith(".sst") and (copy / f.name).is_file())
    if not ssts:
        return None
    newer = changelogs_only_in(done, latest, older, f"state:{OPERATOR}/1")
    if not newer:
        return None
    return _Damage(latest, older, newer[-1], copy / ssts[0])


def test_corrupt_local_copy_and_corrupt_remote_checkpoint_fall_back_then_nothing_valid_refuses(
        spark, tmp_path: Path, expected) -> None:
    """Seed 003 ("Bad table magic number" kills the pod): a damaged local recovery copy
    is replaced from checkpoint storage; a damaged checkpoint in storage makes the job
    fall back to the next older one; with none valid the job refuses to start, and
    restore.mode=empty starts from scratch."""
    name, out = "safety", tmp_path / "out"
    settings = job_settings(tmp_path, name, **SNAPSHOTS_BY_COUNT)
    fs, layout = job_storage(str(tmp_path / "checkpoints"), job_name=name)
    local_root = job_local_root(str(tmp_path / "state"), name, str(tmp_path / "checkpoints"))
    found: list[_Damage] = []

    def plan_holds(event, _completed) -> bool:
        """Right after a checkpoint's `_metadata`: the moment the plan's files are fixed."""
        if not (event.seam == "storage" and event.after and event.path.endswith("/_metadata")):
            return False
        plan = _damage_plan(local_root, fs, layout)
        if plan is not None:
            found.append(plan)
        return plan is not None

    first = start(EVENTS.pipeline(name, out), settings, spark,
                  crash_at=CrashPoint("when the damage plan holds", plan_holds)).wait_crashed()
    plan = found[0]
    assert _damage_plan(local_root, fs, layout) == plan, "the crash left what the plan describes"

    # Remote: bit rot in a change log only the latest checkpoint references (an epoch
    # after the older checkpoint's), read from storage by whichever executor rebuilds.
    flipped_bytes(Path(layout.join(plan.victim.path)), at=0)
    # Local: "Bad table magic number" in subtask 0's recovery copy of the snapshot the
    # older checkpoint is based on; the live store next to it is left intact.
    _replace_with(plan.local_sst, bad_magic)

    second = restart(first, EVENTS.pipeline(name, out), spark)
    assert second.wait().status is JobStatus.FINISHED, second.tail()

    text = second.text
    assert re.search(rf"ALARM checkpoint {plan.latest} of job {name} is corrupt and is skipped; falling back "
                     rf".*{re.escape(plan.victim.name)}", text), second.tail()
    assert second.job.restored_from == plan.older
    assert re.search(rf"\[{name}\] resuming from checkpoint {plan.older} \(epoch \d+, taken ", text), second.tail()
    assert re.search(rf"ALARM state:{OPERATOR}/0: the local recovery copy was corrupt \([^)]*"
                     rf"{re.escape(plan.local_sst.name)}[^)]*\); those files were restored from checkpoint storage",
                     text), second.tail()
    assert JobStatus.FAILED not in second.job.status.history
    assert canonical(read_output(out)) == expected

    # Nothing valid left: every retained checkpoint damaged in storage, no local copies.
    done = completed_checkpoints(fs, layout)
    retained_files = {f.path for data in done.values() for f in state_files(data)}
    for path in retained_files:  # once each: a shared file flipped twice would be whole again
        flipped_bytes(Path(layout.join(path)), at=0)
    shutil.rmtree(tmp_path / "state")

    refused = start(EVENTS.pipeline(name, out), settings, spark)
    with pytest.raises(NoValidCheckpointError) as refusal:
        refused.wait()
    assert re.search(rf"has {len(done)} completed checkpoint\(s\) .* but none restores", str(refusal.value))
    assert "--set restore.mode=empty" in str(refusal.value) and "sparkpoint doctor" in str(refusal.value)
    after_refusal = canonical(read_output(out))

    scratch_out = tmp_path / "from-scratch" / "out"
    empty = start(EVENTS.pipeline(name, scratch_out),
                  job_settings(tmp_path / "from-scratch", name, **{
                      "execution.checkpointing.dir": str(tmp_path / "checkpoints"), "restore.mode": "empty"}),
                  spark)
    assert empty.wait().status is JobStatus.FINISHED, empty.tail()
    assert f"[{name}] starting fresh: restore.mode=empty" in empty.text, empty.tail()
    assert canonical(read_output(scratch_out)) == expected

    # "Nothing was started, so nothing was lost": the refused run left the committed
    # output as it was (it did not withdraw the epochs of checkpoints it could not restore).
    assert after_refusal == expected, "a refused run must not touch the output"


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
