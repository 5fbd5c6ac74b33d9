"""Open a job's checkpoint storage for a run, in the order storage/ asks for:
lease (refuse a second deployment) → heartbeat → leftovers of crashed runs
collected → durable id counter started."""

from __future__ import annotations

import logging
from typing import Any, Callable

from sparkpoint import faults
from sparkpoint.errors import LeaseLostError
from sparkpoint.storage.checkpoint_storage import JobStorage
from sparkpoint.storage.checkpoint_storage import open_job_storage as _open
from sparkpoint.storage.gc import collect_garbage
from sparkpoint.storage.lease import LeaseKeeper

log = logging.getLogger(__name__)


def open_job_storage(url: str, job_name: str, storage_options: dict[str, Any] | None, *, run_id: str,
                     lease_ttl_ms: int, fault_rules: Any, on_lease_lost: Callable[[LeaseLostError], None],
                     gc_grace_period_s: float = 3600) -> tuple[JobStorage, LeaseKeeper]:
    """The job's storage with its lease held, and the keeper that heartbeats it (stop
    the keeper before `storage.close()`)."""
    rules = faults.parse_fault_rules(fault_rules) if fault_rules else []
    parts = _open(url, job_name, storage_options, run_id, lease_ttl_s=lease_ttl_ms / 1000,
                  wrap_fs=(lambda fs: faults.FaultyStorageFS(fs, rules)) if rules else None)
    parts.lease.acquire()  # LeaseHeldError: a second deployment of this job is refused here
    keeper = LeaseKeeper(parts.lease, on_lease_lost)
    keeper.start()
    try:
        report = collect_garbage(parts.fs, parts.layout, grace_period_s=gc_grace_period_s, lease=parts.lease)
        if any(report.to_dict().get(k) for k in ("deleted_checkpoints", "deleted_shared", "deleted")):
            log.info("cleaned up leftovers of earlier runs: %s", report.to_dict())
    except Exception as e:  # garbage is harmless; never refuse to start over it
        log.warning("could not clean up leftovers of earlier runs (%s); continuing", e)
    parts.ids.start()
    return parts, keeper
