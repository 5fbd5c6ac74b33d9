"""Shared pieces of the issue 4 end-to-end tests: one small keyed-aggregate job, its
failure-free reference output (computed once per session: Spark starts are the
expensive part on a small machine), and ways real checkpoint files get damaged."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkpoint.state.snapshot import HANDLE_FORMAT
from sparkpoint.storage import metadata
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout
from tests.e2e.harness import AGGREGATE_PIPELINE, Job, Proc, canonical

JOB_NAME = "e2e"
OPERATOR = "totals"
# Small on purpose: 10 input epochs, several checkpoints, ~30 s of work per run.
JOB_SHAPE: dict[str, Any] = dict(name=JOB_NAME, template=AGGREGATE_PIPELINE, keys=50, total=20_000,
                                 per_epoch=2_000)
REFERENCE_RETAINED = 2


def make_job(root: Path, **overrides: Any) -> Job:
    return Job(root, **{**JOB_SHAPE, **overrides})


@dataclass
class Reference:
    job: Job
    rows: list[tuple]
    proc: Proc


_reference: Reference | None = None


def reference(tmp_path_factory) -> Reference:
    """The failure-free run (update-mode output is a pure function of the epoch
    boundaries, so every correct run of JOB_SHAPE commits exactly these rows). It keeps
    only REFERENCE_RETAINED checkpoints, which the retention test inspects."""
    global _reference
    if _reference is None:
        job = make_job(tmp_path_factory.mktemp("reference"),
                       sets=[f"execution.checkpointing.num-retained={REFERENCE_RETAINED}"])
        proc = job.run()
        assert proc.popen.returncode == 0 and "FINISHED" in proc.text, proc.text[-3000:]
        _reference = Reference(job, canonical(job.output(), drop=()), proc)
    return _reference


# -- reading a job directory ------------------------------------------------------------

def job_storage(url: str, storage_options: dict | None = None) -> tuple[StorageFS, JobLayout]:
    fs = StorageFS.from_url(url, storage_options)
    return fs, JobLayout(f"{fs.root}/{JOB_NAME}")


def completed_checkpoints(fs: StorageFS, layout: JobLayout) -> dict[int, Any]:
    """checkpoint id -> decoded metadata, for every `chk-<id>/_metadata` present."""
    found = {}
    for name in fs.ls(layout.root):
        m = re.fullmatch(r"chk-(\d+)", name)
        if m and fs.exists(layout.metadata(int(m.group(1)))):
            cid = int(m.group(1))
            found[cid] = metadata.decode(fs.read_bytes(layout.metadata(cid)), JOB_NAME)
    return found


def chk_dir_ids(fs: StorageFS, layout: JobLayout) -> set[int]:
    return {int(m.group(1)) for m in (re.fullmatch(r"chk-(\d+)", n) for n in fs.ls(layout.root)) if m}


def state_handles(data) -> dict[str, dict]:
    return {p: h for p, h in data.handles.items() if isinstance(h, dict) and h.get("format") == HANDLE_FORMAT}


def completed_ids(proc: Proc) -> list[int]:
    return [int(x) for x in re.findall(r"completed checkpoint (\d+) of job", proc.text)]


def local_copy(job: Job, subtask: int, checkpoint_id: int) -> Path:
    return job.root / "state" / JOB_NAME / OPERATOR / f"subtask-{subtask}" / f"chk-{checkpoint_id}"


# -- how real RocksDB files get damaged (same as tests/unit/snapshot) -------------------

def bad_magic(path: Path) -> None:
    """RocksDB's "Bad table magic number": the footer's last 8 bytes are wrong."""
    data = bytearray(path.read_bytes())
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])
    path.write_bytes(bytes(data))


def flipped_bytes(path: Path, at: int = 64) -> None:
    """Bit rot inside the first data block: size unchanged, footer intact."""
    data = bytearray(path.read_bytes())
    for i in range(at, min(at + 16, len(data))):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
