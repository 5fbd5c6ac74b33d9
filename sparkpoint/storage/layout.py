"""Where things live under a job's checkpoint namespace (DESIGN.md §5).

    <root>/<job>/_lease                 who runs this job now
    <root>/<job>/_ids                   highest checkpoint id ever used
    <root>/<job>/chk-<id>/_metadata     written last, exclusive create: presence = completed
    <root>/<job>/chk-<id>/...           files owned by this checkpoint only
    <root>/<job>/shared/...             files shared between incremental checkpoints
    <root>/<job>/savepoints/<name>/     self-contained, relocatable
"""

from __future__ import annotations

import re
from dataclasses import dataclass

METADATA_FILE = "_metadata"
LEASE_FILE = "_lease"
IDS_FILE = "_ids"
SHARED_DIR = "shared"
SAVEPOINTS_DIR = "savepoints"
_CHK_RE = re.compile(r"^chk-(\d+)$")
_JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def valid_job_name(name: str) -> bool:
    return bool(_JOB_NAME_RE.match(name))


def checkpoint_dir_name(checkpoint_id: int) -> str:
    return f"chk-{checkpoint_id}"


def parse_checkpoint_dir_name(name: str) -> int | None:
    m = _CHK_RE.match(name.rstrip("/").rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class JobLayout:
    """Paths (strings, '/'-separated, no scheme) of one job's namespace."""

    root: str  # <root>/<job>, as understood by the job's fsspec filesystem

    def join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *[p.strip("/") for p in parts]])

    @property
    def lease(self) -> str:
        return self.join(LEASE_FILE)

    @property
    def ids(self) -> str:
        return self.join(IDS_FILE)

    @property
    def shared(self) -> str:
        return self.join(SHARED_DIR)

    def checkpoint(self, checkpoint_id: int) -> str:
        return self.join(checkpoint_dir_name(checkpoint_id))

    def metadata(self, checkpoint_id: int) -> str:
        return self.join(checkpoint_dir_name(checkpoint_id), METADATA_FILE)
