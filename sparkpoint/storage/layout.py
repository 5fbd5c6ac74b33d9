"""Where things live under a job's checkpoint namespace (DESIGN.md §5).

    <root>/<job>/_lease/<token:020d>    who runs this job now: one file per fencing token
    <root>/<job>/_ids                   highest checkpoint id ever used
    <root>/<job>/chk-<id>/_started      written first, exclusive create: claims the id
    <root>/<job>/chk-<id>/_metadata     written last, exclusive create: presence = completed
    <root>/<job>/chk-<id>/...           files owned by this checkpoint only
    <root>/<job>/shared/...             files shared between incremental checkpoints
    <root>/<job>/savepoints/<name>/     self-contained, relocatable
"""

from __future__ import annotations

import re
from dataclasses import dataclass

METADATA_FILE = "_metadata"
STARTED_FILE = "_started"
LEASE_FILE = "_lease"
IDS_FILE = "_ids"
SHARED_DIR = "shared"
SAVEPOINTS_DIR = "savepoints"
_CHK_RE = re.compile(r"^chk-(\d+)$")
_JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_LEASE_TOKEN_RE = re.compile(r"^(\d{20})$")
_CHK_IN_PATH_RE = re.compile(r"(?:^|/)chk-(\d+)(?:/|$)")


def valid_job_name(name: str) -> bool:
    return bool(_JOB_NAME_RE.match(name))


def checkpoint_dir_name(checkpoint_id: int) -> str:
    return f"chk-{checkpoint_id}"


def parse_checkpoint_dir_name(name: str) -> int | None:
    m = _CHK_RE.match(name.rstrip("/").rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def lease_token_name(token: int) -> str:
    # Zero-padded so names sort in token order on every backend.
    return f"{token:020d}"


def parse_lease_token_name(name: str) -> int | None:
    m = _LEASE_TOKEN_RE.match(name.rstrip("/").rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def checkpoint_id_in_path(path: str) -> int | None:
    """The id of the `chk-<id>` directory a path lies in, if any."""
    m = _CHK_IN_PATH_RE.search(path)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class JobLayout:
    """Paths (strings, '/'-separated, no scheme) of one job's namespace."""

    root: str  # <root>/<job>, as understood by the job's fsspec filesystem

    def join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *[p.strip("/") for p in parts]])

    @property
    def job_name(self) -> str:
        return self.root.rstrip("/").rsplit("/", 1)[-1]

    @property
    def lease(self) -> str:
        """The lease directory (one file per fencing token, see storage/lease.py)."""
        return self.join(LEASE_FILE)

    def lease_token(self, token: int) -> str:
        return self.join(LEASE_FILE, lease_token_name(token))

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

    def started(self, checkpoint_id: int) -> str:
        return self.join(checkpoint_dir_name(checkpoint_id), STARTED_FILE)

    def resolve(self, relative_path: str) -> str:
        """Absolute storage path of a handle's job-relative file path. Refuses paths that
        would leave the job's namespace: a handle must never make us touch another job."""
        parts = relative_path.split("/")
        if relative_path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"file path {relative_path!r} in a state handle is not a plain path "
                             f"relative to the job directory {self.root}")
        return self.join(relative_path)

    def relative(self, path: str) -> str:
        """Job-relative form of an absolute storage path below this job's root."""
        prefix = self.root.rstrip("/") + "/"
        if not path.startswith(prefix):
            raise ValueError(f"{path} is not inside the job directory {self.root}")
        return path[len(prefix):]
