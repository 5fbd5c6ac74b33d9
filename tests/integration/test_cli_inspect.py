"""`sparkpoint checkpoints list|verify` and `sparkpoint doctor` on a real checkpoint
directory: real RocksDB checkpoints uploaded and committed the way the runtime does it
(no Spark needed), then damaged the ways disks and crashes damage them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import rocksdict
from click.testing import CliRunner

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.ops.cli import cli
from sparkpoint.state.snapshot import SnapshotHandleIndex, snapshot_files
from sparkpoint.state.upload import upload_snapshot
from sparkpoint.storage import metadata
from sparkpoint.storage.checkpoint_storage import open_job_storage

JOB = "orders"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Checkpoint root with job `orders`: chk-1 and chk-2 completed (incremental: chk-2
    reuses chk-1's SSTs), lease released as after a clean shutdown."""
    root = tmp_path / "checkpoints"
    storage = open_job_storage(str(root), JOB, run_id="run-1")
    storage.lease.acquire()
    storage.ids.start()
    db = rocksdict.Rdict(str(tmp_path / "db"), rocksdict.Options(raw_mode=True))
    rng = random.Random(7)
    index = SnapshotHandleIndex()
    try:
        for _ in range(2):
            checkpoint_id = storage.ids.get_and_increment()
            for i in range(2_000):
                db.put(b"key-%06d-%d" % (i, checkpoint_id), rng.randbytes(40))
            local = tmp_path / "local" / f"chk-{checkpoint_id}"
            local.parent.mkdir(parents=True, exist_ok=True)
            rocksdict.Checkpoint(db).create_checkpoint(str(local))
            location = storage.checkpoints.initialize_location(checkpoint_id)
            uploaded = upload_snapshot(str(local), storage.fs, storage.layout, checkpoint_id, "state/counts/0",
                                       previous=index)
            index.add(uploaded.handle)
            storage.checkpoints.commit_metadata(location, CompletedCheckpointData(
                JOB, checkpoint_id, 1_000 * checkpoint_id, 1_000 * checkpoint_id + 50,
                {"job": {"epoch": checkpoint_id}, "state:counts/0": uploaded.handle}))
    finally:
        db.close()
    storage.close()
    return root


def sparkpoint(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _handle(root: Path, checkpoint_id: int) -> dict:
    raw = (root / JOB / f"chk-{checkpoint_id}" / "_metadata").read_bytes()
    return dict(metadata.decode(raw, JOB).handles["state:counts/0"])


def _own_sst(root: Path, checkpoint_id: int, other: int) -> Path:
    """An SST file only `checkpoint_id` references (damaging it leaves `other` valid)."""
    others = {f.path for f in snapshot_files(_handle(root, other))}
    own = [f for f in snapshot_files(_handle(root, checkpoint_id)) if f.name.endswith(".sst") and f.path not in others]
    assert own, "chk-2 added SSTs of its own"
    return root / JOB / own[0].path


def test_healthy_directory(root: Path) -> None:
    code, out = sparkpoint("checkpoints", "list", str(root), "--json")
    assert code == 0
    [job] = json.loads(out)["jobs"]
    assert job["job_name"] == JOB
    assert [(c["checkpoint_id"], c["completed"]) for c in job["checkpoints"]] == [(1, True), (2, True)]
    assert job["checkpoints"][1]["file_count"] > job["checkpoints"][0]["file_count"] - 1

    code, out = sparkpoint("checkpoints", "verify", str(root))
    assert code == 0, out
    assert "chk-1: ok" in out and "chk-2: ok" in out and out.strip().endswith("OK")

    code, out = sparkpoint("doctor", str(root))
    assert code == 0, out
    assert "healthy" in out and "[restore-point] the job restores from chk-2" in out
    assert "[lease-released]" in out


def test_corrupt_file_in_the_latest_checkpoint(root: Path) -> None:
    sst = _own_sst(root, 2, other=1)
    data = bytearray(sst.read_bytes())
    data[100] ^= 0xFF  # bit rot: same size, only the checksum can tell
    sst.write_bytes(bytes(data))

    code, out = sparkpoint("checkpoints", "verify", str(root))
    assert code == 1, out
    assert "chk-1: ok" in out and "chk-2: CORRUPT" in out
    # The participant, the file's job-relative path, and what is wrong with it.
    assert f"- state:counts/0: {sst.relative_to(root / JOB).as_posix()} fails its sha256 check" in out
    assert "falls back to the newest valid one (chk-1)" in out

    code, out = sparkpoint("checkpoints", "verify", str(root), "--json")
    report = json.loads(out)
    assert code == 1 and report["ok"] is False
    assert [c["ok"] for c in report["jobs"][0]["checkpoints"]] == [True, False]

    code, out = sparkpoint("doctor", str(root), "--json")
    assert code == 1
    findings = {f["code"]: f for f in json.loads(out)["jobs"][0]["findings"]}
    assert findings["checkpoint-invalid"]["severity"] == "error"
    assert "fails its sha256 check" in findings["checkpoint-invalid"]["message"]
    assert "chk-1" in findings["checkpoint-invalid"]["what_to_do"]
    assert findings["restore-point"]["message"] == "the job restores from chk-1"


def test_missing_file_in_every_checkpoint_means_nothing_restores(root: Path) -> None:
    shared = {f.path for f in snapshot_files(_handle(root, 1))} & {f.path for f in snapshot_files(_handle(root, 2))}
    assert shared, "incremental: chk-2 reuses files of chk-1"
    (root / JOB / sorted(shared)[0]).unlink()

    code, out = sparkpoint("checkpoints", "verify", str(root), "--job", JOB)
    assert code == 1 and out.count("CORRUPT") == 2 and "missing" in out
    assert "none left: the job will refuse to start" in out

    code, out = sparkpoint("doctor", str(root))
    assert code == 1 and "NEEDS ATTENTION" in out and "none is valid, so the job will refuse to start" in out


def test_orphan_checkpoint_directory(root: Path) -> None:
    storage = open_job_storage(str(root), JOB, run_id="run-2")
    storage.lease.acquire()
    storage.checkpoints.initialize_location(3)  # then the run crashed before `_metadata`
    (root / JOB / "chk-3" / "state").mkdir()
    (root / JOB / "chk-3" / "state" / "000099.log").write_bytes(b"x" * 10)

    code, out = sparkpoint("checkpoints", "list", str(root / JOB), "--json")
    assert code == 0
    rows = json.loads(out)["jobs"][0]["checkpoints"]
    assert [(r["checkpoint_id"], r["completed"]) for r in rows] == [(1, True), (2, True), (3, False)]

    code, out = sparkpoint("checkpoints", "verify", str(root))
    assert code == 0, out  # never completed, never restored from: not a verification failure
    assert "chk-3: skipped, never completed" in out

    code, out = sparkpoint("doctor", str(root), "--json")
    assert code == 0, out
    findings = {f["code"]: f for f in json.loads(out)["jobs"][0]["findings"]}
    assert "[3]" in findings["orphan-checkpoint-dirs"]["message"]
    assert "never restored from" in findings["orphan-checkpoint-dirs"]["what_to_do"]
    assert findings["lease-held"]["message"].startswith(f"job '{JOB}' is held by run run-2")


def test_directory_without_jobs_is_an_error_that_says_what_to_pass(tmp_path: Path) -> None:
    code, out = sparkpoint("doctor", str(tmp_path))
    assert code == 1 and "no sparkpoint job directory" in out and "execution.checkpointing.dir" in out
    code, out = sparkpoint("checkpoints", "verify", str(tmp_path))
    assert code == 1 and "FAILED" in out
    code, out = sparkpoint("checkpoints", "list", str(tmp_path), "--job", "nope", "--json")
    assert code == 0 and json.loads(out)["jobs"] == []
