"""Checkpoint storage as an executor sees it: opened once per Python worker process
(Spark reuses workers) from the URL and options the task carries."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from sparkpoint.state.upload import FileHashCache
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout

_lock = threading.Lock()
_open: dict[str, tuple[StorageFS, JobLayout]] = {}
# Hashes of SSTs this worker has already seen (hard-linked SSTs keep inode and mtime).
HASH_CACHE = FileHashCache()


@dataclass(frozen=True)
class StorageRef:
    """Enough to open the job's checkpoint storage anywhere."""

    url: str
    job_name: str
    options: dict[str, Any] = field(default_factory=dict)
    fault_rules: tuple = ()

    def open(self, checkpoint_id: int | None = None) -> tuple[StorageFS, JobLayout]:
        """The storage; with fault rules, those that apply to the barrier of
        `checkpoint_id` (a rule's `checkpoints` names the checkpoints whose state writes
        fail: on executors state files are not under `chk-<id>/`, so the task says)."""
        rules = []
        for rule in self.fault_rules:
            if "participant" in rule:
                continue
            wanted = rule.get("checkpoints")
            if wanted is not None:
                ids = wanted if isinstance(wanted, (list, tuple)) else [wanted]
                if checkpoint_id is None or checkpoint_id not in [int(i) for i in ids]:
                    continue
                rule = {k: v for k, v in rule.items() if k != "checkpoints"}
            rules.append(rule)
        key = json.dumps([self.url, self.job_name, self.options, rules], sort_keys=True, default=str)
        with _lock:
            hit = _open.get(key)
            if hit is None:
                fs = StorageFS.from_url(self.url, self.options)
                if rules:
                    from sparkpoint.faults import FaultyStorageFS, parse_fault_rules

                    fs = FaultyStorageFS(fs, parse_fault_rules(rules))
                hit = (fs, JobLayout(f"{fs.root}/{self.job_name}"))
                _open[key] = hit
            return hit
