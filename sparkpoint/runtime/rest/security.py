"""Who may steer a running job through its REST API.

- **Control requests** (every POST: checkpoint, savepoint, stop) carry the job's control
  token, `Authorization: Bearer <token>`. The job generates it at start and writes it to
  `<runtime dir>/rest-<run-id>.token`, mode 0600 in a 0700 directory, so only the job's
  user can read it; `sparkpoint checkpoint|savepoint|stop` read it from there. The runtime
  directory is `$SPARKPOINT_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/sparkpoint`, else
  `~/.sparkpoint/run`. A configured `rest.token` is accepted as well (for operators on
  other machines), and is then required for every request.
- **Browsers**: a page on another site can make the operator's browser send requests to
  127.0.0.1. Those are refused by the `Host` check (a rebound DNS name is not this
  server's name), the `Origin` check (a POST from another origin), and the JSON-only rule
  (a form or a no-cors fetch cannot send `Content-Type: application/json`); they never
  hold the token either.
- A token is never accepted in a URL: URLs end up in logs and in the browser's history."""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import secrets
import socket
import stat
from pathlib import Path
from urllib.parse import urlsplit

RUNTIME_DIR_ENV = "SPARKPOINT_RUNTIME_DIR"


# ------------------------------------------------------------------------ control token
def runtime_dir() -> Path:
    explicit = os.environ.get(RUNTIME_DIR_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "sparkpoint"
    return Path.home() / ".sparkpoint" / "run"


def control_token_path(run_id: str) -> Path:
    # The run id comes from a lease that anyone who can write the checkpoint directory
    # can write: it must not lead out of the runtime directory.
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", run_id) or run_id.startswith("."):
        raise ValueError(f"not a run id: {run_id!r}")
    return runtime_dir() / f"rest-{run_id}.token"


def new_control_token() -> str:
    return secrets.token_urlsafe(32)


def write_control_token(run_id: str, token: str) -> Path:
    """Writes the token where only this user can read it; OSError if it cannot be made
    private (a directory owned by someone else, say)."""
    directory = runtime_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(f"{directory} is not a directory of this user (uid {os.getuid()})")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(directory, 0o700)
    path = control_token_path(run_id)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode() + b"\n")
    finally:
        os.close(fd)
    return path


def read_control_token(run_id: str) -> str | None:
    """The token of run `run_id` on this machine, if this user may read it."""
    try:
        return control_token_path(run_id).read_text().strip() or None
    except (OSError, ValueError):
        return None


def remove_control_token(run_id: str) -> None:
    try:
        control_token_path(run_id).unlink()
    except (OSError, ValueError):
        pass


def bearer_matches(header: str, *tokens: str | None) -> bool:
    given = header[7:].strip() if header.startswith("Bearer ") else ""
    # Every candidate is compared, whatever matched, so the timing says nothing.
    matches = [hmac.compare_digest(given.encode(), t.encode()) for t in tokens if t]
    return bool(given) and any(matches)


# ------------------------------------------------------------------------- Host, Origin
def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def host_name(header: str) -> str:
    """'127.0.0.1:8081' -> '127.0.0.1', '[::1]:8081' -> '::1'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_allowed(header: str | None, bind_host: str) -> bool:
    """Whether a request's `Host` names this server. On a loopback bind only loopback
    names do: a DNS name an attacker rebound to 127.0.0.1 does not. On another bind (which
    requires rest.token for every request) the bound address, any IP literal and this
    machine's own names do."""
    if not header:
        return False
    name = host_name(header)
    if is_loopback(name):
        return True
    if is_loopback(bind_host):
        return False
    if _is_ip(name) or name == bind_host.strip("[]").lower():
        return True
    return name in {socket.gethostname().lower(), socket.getfqdn().lower()}


def same_origin(origin: str | None, host_header: str | None) -> bool:
    """An `Origin` header (browsers send one with every POST) names this very server."""
    if origin is None:
        return True
    if not host_header or origin.strip().lower() == "null":
        return False
    parts = urlsplit(origin.strip().lower())
    return parts.scheme == "http" and parts.netloc == host_header.strip().lower()
