"""What `sparkpoint checkpoints list|verify` and `sparkpoint doctor` print.

DIR is either a checkpoint root holding one directory per job, or one job directory
itself; `--job NAME` picks one job under a root. Every report has `to_dict()` (for
`--json`) and `render()` (for people: each finding says what to do); verify and doctor
also have `ok`, which the CLI turns into the exit code (0 ok, 1 not).

The checks themselves live in `sparkpoint.storage.inspect`: `_metadata` is read by
`sparkpoint.storage.metadata.read_completed` (as restore reads it), and every file of
every handle is checked in place by `inspect.check_file` (size, then sha256), the same
for `checkpoints verify` and `doctor`. Everything here only reads storage.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.inspect import (
    CheckpointSummary,
    DoctorReport,
    Finding,
    Severity,
    VerifyResult,
    doctor,
    list_checkpoints,
    verify_checkpoints,
)
from sparkpoint.storage.layout import IDS_FILE, LEASE_FILE, JobLayout, parse_checkpoint_dir_name

NOT_A_CHECKPOINT_DIR = (
    "Pass the checkpoint root (execution.checkpointing.dir) or one job directory below it; "
    "`sparkpoint run` prints both when it starts.")


# -- locating jobs -----------------------------------------------------------------
@dataclass(frozen=True)
class JobDir:
    fs: StorageFS
    layout: JobLayout

    @property
    def name(self) -> str:
        return self.layout.job_name


def _looks_like_job(fs: StorageFS, path: str) -> bool:
    names = fs.ls(path)
    return any(n in (LEASE_FILE, IDS_FILE) or parse_checkpoint_dir_name(n) is not None for n in names)


def find_jobs(directory: str, job: str | None = None,
              storage_options: dict | None = None) -> list[JobDir]:
    """The job directories DIR stands for (see module doc); [] if there are none."""
    fs = StorageFS.from_url(directory, storage_options)
    if job is not None:
        path = f"{fs.root}/{job}"
        return [JobDir(fs, JobLayout(path))] if _looks_like_job(fs, path) else []
    if _looks_like_job(fs, fs.root):
        return [JobDir(fs, JobLayout(fs.root))]
    return [JobDir(fs, JobLayout(f"{fs.root}/{name}")) for name in fs.ls(fs.root)
            if _looks_like_job(fs, f"{fs.root}/{name}")]


def _no_job_message(directory: str, job: str | None) -> str:
    what = f"no job {job!r} under {directory}" if job else f"no sparkpoint job directory in {directory}"
    return f"{what}: nothing there has _lease, _ids or chk-<id> entries"


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


# -- list --------------------------------------------------------------------------
@dataclass(frozen=True)
class JobListing:
    job_name: str
    path: str
    checkpoints: list[CheckpointSummary]

    def to_dict(self) -> dict[str, Any]:
        return {"job_name": self.job_name, "path": self.path,
                "checkpoints": [c.to_dict() for c in self.checkpoints]}


@dataclass(frozen=True)
class ListReport:
    directory: str
    jobs: list[JobListing]
    job: str | None = None  # the --job asked for, if any

    def to_dict(self) -> dict[str, Any]:
        return {"directory": self.directory, "jobs": [j.to_dict() for j in self.jobs]}

    def render(self) -> str:
        if not self.jobs:
            return f"{_no_job_message(self.directory, self.job)}. {NOT_A_CHECKPOINT_DIR}"
        lines = []
        for j in self.jobs:
            lines.append(f"job {j.job_name}  ({j.path})")
            if not j.checkpoints:
                lines.append("  no checkpoints")
            for c in j.checkpoints:
                state = "completed" if c.completed else ("UNREADABLE" if c.problem else "not completed")
                lines.append(f"  chk-{c.checkpoint_id:<6} {state:<13} {_when(c.completion_timestamp_ms):<19} "
                             f"{c.file_count:>5} files {c.size_bytes:>12,} bytes"
                             + (f"  ({c.problem})" if c.problem else ""))
        return "\n".join(lines)


def list_report(directory: str, job: str | None = None, storage_options: dict | None = None) -> ListReport:
    return ListReport(directory, [JobListing(j.name, j.layout.root, list_checkpoints(j.fs, j.layout))
                                  for j in find_jobs(directory, job, storage_options)], job)


# -- verify ------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointVerification:
    checkpoint_id: int
    completed: bool
    ok: bool
    files_checked: int
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint_id": self.checkpoint_id, "completed": self.completed, "ok": self.ok,
                "files_checked": self.files_checked, "problems": list(self.problems)}


@dataclass(frozen=True)
class JobVerification:
    job_name: str
    path: str
    checkpoints: list[CheckpointVerification]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checkpoints)

    def to_dict(self) -> dict[str, Any]:
        return {"job_name": self.job_name, "path": self.path, "ok": self.ok,
                "checkpoints": [c.to_dict() for c in self.checkpoints]}


@dataclass(frozen=True)
class VerifyReport:
    directory: str
    jobs: list[JobVerification]
    job: str | None = None  # the --job asked for, if any

    @property
    def ok(self) -> bool:
        return bool(self.jobs) and all(j.ok for j in self.jobs)

    def to_dict(self) -> dict[str, Any]:
        return {"directory": self.directory, "ok": self.ok, "jobs": [j.to_dict() for j in self.jobs]}

    def render(self) -> str:
        if not self.jobs:
            return f"FAILED: {_no_job_message(self.directory, self.job)}. {NOT_A_CHECKPOINT_DIR}"
        lines = []
        for j in self.jobs:
            lines.append(f"job {j.job_name}  ({j.path})")
            for c in j.checkpoints:
                if not c.completed:
                    lines.append(f"  chk-{c.checkpoint_id}: skipped, never completed (never restored from)")
                elif c.ok:
                    lines.append(f"  chk-{c.checkpoint_id}: ok ({c.files_checked} files)")
                else:
                    lines.append(f"  chk-{c.checkpoint_id}: CORRUPT")
                    lines += [f"    - {p}" for p in c.problems]
            bad = [c.checkpoint_id for c in j.checkpoints if not c.ok]
            good = [c.checkpoint_id for c in j.checkpoints if c.completed and c.ok]
            if bad:
                fallback = (f"chk-{good[-1]}" if good else "none left: the job will refuse to start; restore "
                            "the files, or run with restore.mode=empty")
                lines.append(f"  what to do: restore skips corrupt checkpoints and falls back to the newest "
                             f"valid one ({fallback}). Check the storage the files live on; "
                             f"`sparkpoint doctor` tells more.")
            elif not good:
                lines.append("  no completed checkpoint: the job starts from empty state")
        lines.append("OK" if self.ok else "FAILED")
        return "\n".join(lines)


def _cli_result(r: VerifyResult) -> CheckpointVerification:
    """A directory that never completed is skipped, not a failure: it is never restored from."""
    if not r.completed:
        return CheckpointVerification(r.checkpoint_id, False, True, 0)
    return CheckpointVerification(r.checkpoint_id, True, r.ok, r.files_checked, list(r.problems))


def verify_report(directory: str, job: str | None = None, storage_options: dict | None = None) -> VerifyReport:
    jobs = []
    for j in find_jobs(directory, job, storage_options):
        jobs.append(JobVerification(j.name, j.layout.root,
                                    [_cli_result(r) for r in verify_checkpoints(j.fs, j.layout, hash_files=True)]))
    return VerifyReport(directory, jobs, job)


# -- doctor ------------------------------------------------------------------------
@dataclass(frozen=True)
class DoctorCliReport:
    directory: str
    jobs: list[DoctorReport]
    problem: Finding | None = None  # set when DIR holds no job at all

    @property
    def ok(self) -> bool:
        return self.problem is None and all(r.healthy for r in self.jobs)

    def to_dict(self) -> dict[str, Any]:
        return {"directory": self.directory, "ok": self.ok,
                "problem": self.problem.to_dict() if self.problem else None,
                "jobs": [r.to_dict() for r in self.jobs]}

    def render(self) -> str:
        if self.problem is not None:
            return f"ERROR {self.problem.message}\n  what to do: {self.problem.what_to_do}"
        order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
        lines = []
        for r in self.jobs:
            completed = sum(1 for c in r.checkpoints if c.completed)
            lines.append(f"job {r.job_name}: {completed} completed checkpoint(s), "
                         f"{len(r.checkpoints) - completed} other chk dir(s) — "
                         + ("healthy" if r.healthy else "NEEDS ATTENTION"))
            for f in sorted(r.findings, key=lambda f: order[f.severity]):
                lines.append(f"  {f.severity.value.upper():<7} [{f.code}] {f.message}")
                lines.append(f"          what to do: {f.what_to_do}")
        return "\n".join(lines)


def doctor_report(directory: str, job: str | None = None, storage_options: dict | None = None) -> DoctorCliReport:
    jobs = find_jobs(directory, job, storage_options)
    if not jobs:
        return DoctorCliReport(directory, [], Finding(Severity.ERROR, "no-job-dir",
                                                      _no_job_message(directory, job), NOT_A_CHECKPOINT_DIR))
    # Hash every file: a flipped byte keeps the size, and doctor is where people look first.
    return DoctorCliReport(directory, [doctor(j.fs, j.layout, hash_files=True) for j in jobs])
