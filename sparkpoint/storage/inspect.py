"""What `sparkpoint checkpoints list`, `sparkpoint checkpoints verify` and
`sparkpoint doctor` report, as pure functions over storage (read-only).

Each result is a dataclass with `to_dict()` for `--json`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Callable, Iterable

from sparkpoint.checkpoint.interfaces import CompletedCheckpointData
from sparkpoint.errors import CorruptCheckpointError, ForeignCheckpointError, StorageError
from sparkpoint.storage import metadata
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.handles import FileEntry, checkpoint_file_entries, iter_file_entries
from sparkpoint.storage.ids import list_checkpoint_ids, read_highest_used
from sparkpoint.storage.layout import JobLayout
from sparkpoint.storage.lease import describe_holder, holder_process_gone, read_current_lease, storage_dir_of


@dataclass(frozen=True)
class CheckpointSummary:
    checkpoint_id: int
    completed: bool
    trigger_timestamp_ms: int | None
    completion_timestamp_ms: int | None
    size_bytes: int  # completed: all files it references (full state); else: what its directory holds
    file_count: int
    problem: str | None = None  # why `_metadata` could not be read

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class VerifyResult:
    checkpoint_id: int
    ok: bool
    files_checked: int
    problems: list[str] = field(default_factory=list)
    completed: bool = True  # a `_metadata` is present (readable or not); False: never completed

    def to_dict(self) -> dict:
        return asdict(self)


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class Finding:
    severity: Severity
    code: str  # stable identifier, e.g. "lease-expired", for scripts
    message: str
    what_to_do: str

    def to_dict(self) -> dict:
        return {**asdict(self), "severity": self.severity.value}


@dataclass(frozen=True)
class DoctorReport:
    job_name: str
    findings: list[Finding]
    checkpoints: list[CheckpointSummary]
    lease: dict | None

    @property
    def healthy(self) -> bool:
        return all(f.severity is not Severity.ERROR for f in self.findings)

    def to_dict(self) -> dict:
        return {"job_name": self.job_name, "healthy": self.healthy, "lease": self.lease,
                "findings": [f.to_dict() for f in self.findings],
                "checkpoints": [c.to_dict() for c in self.checkpoints]}


# -- list ----------------------------------------------------------------------------
def _read_metadata(fs: StorageFS, layout: JobLayout, checkpoint_id: int
                   ) -> tuple[CompletedCheckpointData | None, str | None]:
    """`metadata.read_completed` with inspection's error policy: (data, None) if completed
    and readable, (None, problem) if unreadable, (None, None) if there is no `_metadata`."""
    try:
        return metadata.read_completed(fs, layout, checkpoint_id), None
    except (CorruptCheckpointError, ForeignCheckpointError) as e:
        return None, str(e)


def _file_entries(data: CompletedCheckpointData) -> tuple[list[FileEntry], str | None]:
    """The checkpoint's state file entries, or the reason its handles cannot be read:
    one damaged checkpoint is a finding, never a crash of the whole report."""
    try:
        return checkpoint_file_entries(data.handles), None
    except CorruptCheckpointError as e:
        return [], f"its handles cannot be read: {e}"


def list_checkpoints(fs: StorageFS, layout: JobLayout) -> list[CheckpointSummary]:
    summaries = []
    for checkpoint_id in list_checkpoint_ids(fs, layout):
        data, problem = _read_metadata(fs, layout, checkpoint_id)
        if data is not None:
            entries, problem = _file_entries(data)
            summaries.append(CheckpointSummary(
                checkpoint_id, True, data.trigger_timestamp_ms, data.completion_timestamp_ms,
                sum(max(e.size, 0) for e in entries), len(entries), problem))
        else:
            files = fs.find(layout.checkpoint(checkpoint_id))
            summaries.append(CheckpointSummary(checkpoint_id, False, None, None,
                                               sum(f.size for f in files), len(files), problem))
    return summaries


# -- verify --------------------------------------------------------------------------
def check_file(fs: StorageFS, layout: JobLayout, entry: FileEntry, hash_files: bool = True) -> str | None:
    """None if the file of `entry` is in checkpoint storage with the recorded size and
    (with `hash_files`) sha256, else what is wrong. The one check of a stored file against
    its entry, read in place: `checkpoints verify` and `doctor` both use it. A path that
    would leave the job directory is a problem, never read."""
    try:
        path = layout.resolve(entry.path)
    except ValueError as e:
        return str(e)
    try:
        if not fs.exists(path):
            return f"{entry.path} is missing"
        size = fs.size(path)
        if entry.size >= 0 and size != entry.size:
            return f"{entry.path} has {size} bytes, the checkpoint recorded {entry.size}"
        if hash_files and entry.sha256 and fs.sha256(path) != entry.sha256:
            return f"{entry.path} fails its sha256 check (damaged or overwritten)"
    except FileNotFoundError:
        return f"{entry.path} is missing"
    except StorageError as e:
        return f"{entry.path} could not be checked: {e}"
    return None


def _entries_by_participant(data: CompletedCheckpointData
                            ) -> tuple[dict[str, tuple[FileEntry, list[str]]], list[str]]:
    """Every file entry of the checkpoint, once per path, with the participants that
    reference it; and the participants whose handles cannot be read."""
    entries: dict[str, tuple[FileEntry, list[str]]] = {}
    problems: list[str] = []
    for participant, handle in sorted(data.handles.items()):
        try:
            found = list(iter_file_entries(handle))
        except CorruptCheckpointError as e:
            problems.append(f"{participant}: its handle cannot be read: {e}")
            continue
        for entry in found:
            _, names = entries.setdefault(entry.path, (entry, []))
            if participant not in names:
                names.append(participant)
    return dict(sorted(entries.items())), problems


def verify_checkpoint(fs: StorageFS, layout: JobLayout, checkpoint_id: int,
                      hash_files: bool = True) -> VerifyResult:
    """Check one checkpoint the way restore reads it (docs/checkpoint-format.md, steps
    1-7): `_metadata` via `metadata.read_completed`, then every file of every handle
    (`handles.iter_file_entries`) with `check_file`. Each problem names the participant
    whose handle references the file."""
    data, problem = _read_metadata(fs, layout, checkpoint_id)
    if data is None:
        if problem is not None:
            return VerifyResult(checkpoint_id, False, 0, [problem])
        return VerifyResult(checkpoint_id, False, 0, ["no _metadata: the checkpoint never completed"],
                            completed=False)
    entries, problems = _entries_by_participant(data)
    for entry, participants in entries.values():
        problem = check_file(fs, layout, entry, hash_files)
        if problem is not None:
            problems.append(f"{', '.join(participants)}: {problem}")
    return VerifyResult(checkpoint_id, not problems, len(entries), problems)


def verify_checkpoints(fs: StorageFS, layout: JobLayout, checkpoint_ids: Iterable[int] | None = None,
                       hash_files: bool = True) -> list[VerifyResult]:
    """`verify_checkpoint` for every `chk-<id>` directory (or those of `checkpoint_ids`).
    Directories without `_metadata` are reported as not completed (`completed=False`)."""
    wanted = set(checkpoint_ids) if checkpoint_ids is not None else None
    return [verify_checkpoint(fs, layout, checkpoint_id, hash_files)
            for checkpoint_id in list_checkpoint_ids(fs, layout)
            if wanted is None or checkpoint_id in wanted]


# -- doctor --------------------------------------------------------------------------
def doctor(fs: StorageFS, layout: JobLayout, clock: Callable[[], float] = time.time,
           hash_files: bool = False) -> DoctorReport:
    """Diagnose a job directory. Every finding says what is wrong and what to do."""
    now_ms = int(clock() * 1000)
    findings: list[Finding] = []
    lease_info = _lease_findings(fs, layout, now_ms, findings)
    summaries = list_checkpoints(fs, layout)
    completed = [s for s in summaries if s.completed]
    verified = {r.checkpoint_id: r for r in verify_checkpoints(
        fs, layout, [s.checkpoint_id for s in completed], hash_files=hash_files)}

    for s in summaries:
        if s.problem is not None:
            findings.append(Finding(
                Severity.ERROR, "corrupt-metadata", f"chk-{s.checkpoint_id}: {s.problem}",
                "It is skipped on restore. Keep it for investigation or delete the directory."))
    if not completed:
        findings.append(Finding(Severity.INFO, "no-completed-checkpoint",
                                "no completed checkpoint: the job starts from empty state",
                                "Nothing to do, unless you expected checkpoints here: check the "
                                "job name and the checkpoint directory."))
    else:
        latest = completed[-1].checkpoint_id
        valid = [c for c in completed if verified[c.checkpoint_id].ok]
        for c in completed:
            result = verified[c.checkpoint_id]
            if result.ok:
                continue
            is_latest = c.checkpoint_id == latest
            findings.append(Finding(
                Severity.ERROR if is_latest else Severity.WARNING, "checkpoint-invalid",
                f"chk-{c.checkpoint_id} fails verification: " + "; ".join(result.problems[:5]),
                ("Restore falls back to an older valid checkpoint"
                 + (f" (chk-{valid[-1].checkpoint_id})." if valid else "; none is valid, so the job "
                    "will refuse to start (see NoValidCheckpointError).")) if is_latest else
                "It is not the latest; it will be removed when subsumed."))
        if valid:
            findings.append(Finding(Severity.INFO, "restore-point",
                                    f"the job restores from chk-{valid[-1].checkpoint_id}",
                                    "Nothing to do."))

    _id_findings(fs, layout, summaries, findings)
    _orphan_findings(fs, layout, summaries, completed, findings)
    return DoctorReport(layout.job_name, findings, summaries, lease_info)


def _lease_findings(fs: StorageFS, layout: JobLayout, now_ms: int, findings: list[Finding]) -> dict | None:
    record = read_current_lease(fs, layout)
    if record is None:
        findings.append(Finding(Severity.INFO, "lease-none", "no run has ever held this job's lease",
                                "Nothing to do."))
        return None
    info = {**record.to_dict(), "live": record.is_live(now_ms)}
    if record.released:
        findings.append(Finding(Severity.INFO, "lease-released",
                                f"the last run ({record.run_id} on {record.host}) shut down cleanly",
                                "Nothing to do; the next run takes the lease at once."))
    elif record.is_live(now_ms) and holder_process_gone(record):
        findings.append(Finding(
            Severity.WARNING, "lease-holder-dead",
            f"run {record.run_id} (host {record.host}, pid {record.pid}) is dead: no process {record.pid} "
            f"runs on this host any more, but it did not release its lease (kill -9, out of memory)",
            "Nothing to wait for: the next run of this job on this host takes over at once and resumes "
            "from the latest completed checkpoint."))
    elif record.is_live(now_ms):
        findings.append(Finding(Severity.INFO, "lease-held",
                                describe_holder(record, now_ms, storage_dir_of(fs, layout)),
                                "If that run should not be running, stop it (`sparkpoint stop`); a new run "
                                "of this job is refused while it runs."))
    else:
        findings.append(Finding(
            Severity.WARNING, "lease-expired",
            f"run {record.run_id} (host {record.host}, pid {record.pid}) stopped heartbeating "
            f"{(now_ms - record.heartbeat_ms) / 1000:.0f} s ago without releasing its lease "
            f"(it crashed or lost storage)",
            "Make sure it is really gone; the next run takes over automatically."))
    return info


def _id_findings(fs: StorageFS, layout: JobLayout, summaries: list[CheckpointSummary],
                 findings: list[Finding]) -> None:
    recorded = read_highest_used(fs, layout)
    highest_dir = max((s.checkpoint_id for s in summaries), default=0)
    if recorded is None and fs.exists(layout.ids):
        findings.append(Finding(Severity.WARNING, "ids-unreadable", f"{layout.ids} is unreadable",
                                "Nothing to do: the next run continues past the highest chk-* "
                                "directory and rewrites it."))
    elif recorded is None and highest_dir:
        findings.append(Finding(Severity.WARNING, "ids-missing",
                                f"{layout.ids} is missing although chk-{highest_dir} exists",
                                "Nothing to do: the next run continues from "
                                f"{highest_dir + 1}."))
    elif recorded is not None and highest_dir > recorded:
        above = [s.checkpoint_id for s in summaries if s.checkpoint_id > recorded]
        findings.append(Finding(
            Severity.WARNING, "id-collision-risk",
            f"{layout.ids} records {recorded} but directories {above} exist above it (written by "
            f"another run, or `_ids` was restored from a backup)",
            "The next run continues past them, so no id is reused. If another deployment writes "
            "here, give it its own job name."))


def _orphan_findings(fs: StorageFS, layout: JobLayout, summaries: list[CheckpointSummary],
                     completed: list[CheckpointSummary], findings: list[Finding]) -> None:
    unfinished = [s for s in summaries if not s.completed and s.problem is None]
    if unfinished:
        findings.append(Finding(
            Severity.INFO, "orphan-checkpoint-dirs",
            f"{len(unfinished)} checkpoint directories never completed: "
            f"{[s.checkpoint_id for s in unfinished][:20]} ({sum(s.size_bytes for s in unfinished)} bytes)",
            "Nothing to do: they are never restored from; startup gc deletes them after the "
            "grace period (unless a checkpoint is still writing them)."))
    if any(s.problem for s in summaries):
        return  # references unknown: cannot tell orphans from live shared files
    referenced: set[str] = set()
    for s in completed:
        data, _ = _read_metadata(fs, layout, s.checkpoint_id)
        if data is not None:
            referenced |= {e.path for e in _file_entries(data)[0]}
    orphans = [f for f in fs.find(layout.shared) if layout.relative(f.path) not in referenced]
    if orphans:
        findings.append(Finding(
            Severity.INFO, "orphan-shared-files",
            f"{len(orphans)} shared files ({sum(f.size for f in orphans)} bytes) are referenced by "
            f"no completed checkpoint",
            "Nothing to do: startup gc deletes them once older than the grace period."))
