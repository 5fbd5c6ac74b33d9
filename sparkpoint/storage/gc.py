"""Startup cleanup of what crashed runs left behind.

Run once the lease is held and before the first checkpoint is triggered. Deletes:
- `chk-<id>/` directories without `_metadata` (never completed), unless in flight or
  written to within the grace period;
- files under `shared/` that no completed checkpoint references, older than the grace
  period (an in-flight incremental snapshot may have uploaded them moments ago);
- temporary files (`*.tmp-<hex>`) of interrupted atomic writes, older than the grace period;
- epoch plans (`plans/`, storage/epoch_plans.py) at or below the epoch of the oldest
  completed checkpoint: a restore reads only the plans after the checkpoint it restores.
  Checkpoints whose `_metadata` cannot be read do not count: they are never restored.

The grace period must exceed the longest a checkpoint can take (its timeout): a file
younger than that may belong to a checkpoint still being written by some run.
If any `_metadata` cannot be read, no shared file is deleted: we could not know what
that checkpoint references.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

from sparkpoint.errors import CorruptCheckpointError, ForeignCheckpointError
from sparkpoint.storage import metadata
from sparkpoint.storage.fs import FileStat, StorageFS
from sparkpoint.storage.epoch_plans import EpochPlanLog
from sparkpoint.storage.handles import checkpoint_file_entries
from sparkpoint.storage.ids import list_checkpoint_ids
from sparkpoint.storage.layout import JobLayout, checkpoint_id_in_path
from sparkpoint.storage.lease import JobLease

log = logging.getLogger(__name__)

DEFAULT_GRACE_PERIOD_S = 3600.0
_TEMP_MARKER = ".tmp-"


@dataclass
class GcReport:
    dry_run: bool
    deleted_checkpoints: list[int] = field(default_factory=list)
    deleted_shared_files: list[str] = field(default_factory=list)  # job-relative
    deleted_temp_files: list[str] = field(default_factory=list)  # job-relative
    deleted_epoch_plans: list[int] = field(default_factory=list)  # their epochs
    freed_bytes: int = 0
    kept: list[str] = field(default_factory=list)  # what looked like garbage but was kept, and why
    shared_files_skipped_reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def collect_garbage(fs: StorageFS, layout: JobLayout, *, grace_period_s: float = DEFAULT_GRACE_PERIOD_S,
                    in_flight: Iterable[int] = (), lease: JobLease | None = None,
                    clock: Callable[[], float] = time.time, dry_run: bool = False) -> GcReport:
    """Delete stale leftovers (see module doc). With a `lease`, checks it before deleting
    anything (LeaseLostError: another run owns the job now). StorageError on I/O failure."""
    report = GcReport(dry_run=dry_run)
    cutoff = clock() - grace_period_s
    protected = set(in_flight)
    if lease is not None and not dry_run:
        lease.check()

    def stale(files: list[FileStat]) -> bool:
        times = [f.modified for f in files]
        # Unknown age counts as young: we would rather keep garbage than lose state.
        return bool(times) and all(t is not None and t < cutoff for t in times)

    def delete(path: str, recursive: bool = False) -> None:
        if not dry_run:
            fs.rm(path, recursive=recursive)

    referenced: set[str] = set()
    epochs: list[int] = []  # of the completed checkpoints
    for checkpoint_id in list_checkpoint_ids(fs, layout):
        try:
            data = metadata.read_completed(fs, layout, checkpoint_id)
            if data is not None:
                referenced |= {e.path for e in checkpoint_file_entries(data.handles)}
                epoch = (data.handles.get("job") or {}).get("epoch")
                if isinstance(epoch, int):
                    epochs.append(epoch)
                continue
        except (CorruptCheckpointError, ForeignCheckpointError) as e:
            report.shared_files_skipped_reason = (
                f"chk-{checkpoint_id}/_metadata is unreadable ({e}); its references are "
                f"unknown, so no shared file was deleted")
            continue
        chk_dir = layout.checkpoint(checkpoint_id)
        if checkpoint_id in protected:
            report.kept.append(f"chk-{checkpoint_id}: in flight")
            continue
        files = fs.find(chk_dir)
        if not files:
            files = [fs.stat(chk_dir)] if fs.exists(chk_dir) else []
        if not stale(files):
            report.kept.append(f"chk-{checkpoint_id}: no _metadata, but written to within the "
                               f"last {grace_period_s:g} s")
            continue
        log.info("gc: deleting chk-%d (never completed)", checkpoint_id)
        delete(chk_dir, recursive=True)
        report.deleted_checkpoints.append(checkpoint_id)
        report.freed_bytes += sum(f.size for f in files)

    if report.shared_files_skipped_reason is None:
        for f in fs.find(layout.shared):
            rel = layout.relative(f.path)
            if rel in referenced:
                continue
            if not stale([f]):
                report.kept.append(f"{rel}: unreferenced, but younger than {grace_period_s:g} s")
                continue
            delete(f.path)
            report.deleted_shared_files.append(rel)
            report.freed_bytes += f.size
    else:
        log.warning("gc: %s", report.shared_files_skipped_reason)

    if epochs:
        plans = EpochPlanLog(fs, layout)
        report.deleted_epoch_plans = [e for e in plans.epochs() if e <= min(epochs)]
        for e in report.deleted_epoch_plans:
            delete(plans.path(e))

    for f in fs.find(layout.root):
        if _TEMP_MARKER in f.path.rsplit("/", 1)[-1] and stale([f]):
            if checkpoint_id_in_path(layout.relative(f.path)) not in report.deleted_checkpoints:
                delete(f.path)
                report.deleted_temp_files.append(layout.relative(f.path))
                report.freed_bytes += f.size
    return report
