"""Steer a running job through its REST API (docs/operations.md):

    sparkpoint status     --checkpoint-dir DIR --job NAME [--json]
    sparkpoint checkpoint --checkpoint-dir DIR --job NAME [--json]
    sparkpoint savepoint  --checkpoint-dir DIR --job NAME [--target PATH] [--json]
    sparkpoint stop       --checkpoint-dir DIR --job NAME [--savepoint [PATH]] [--json]

The job is found through its lease in DIR (who runs it: host, pid, and where it serves
its REST API), so nobody has to know which port a job took. A job that is not running is
one error line and exit code 1. `kill -USR1 <pid>` still takes a checkpoint where the
API is off (rest.enabled=false).

Anyone who can write DIR can write a lease, so the address in it is not trusted blindly:
a token goes only to a loopback address served by the lease's own process on this host,
or to the address given with --address. The job's control token is read from its
user-private file (sparkpoint/runtime/rest/security.py); --token is for rest.token."""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import click

from sparkpoint.runtime.rest.security import control_token_path, is_loopback, read_control_token

_POLL_S = 0.2


class ControlError(Exception):
    """One line for the user; the command exits 1."""


@dataclass(frozen=True)
class RunningJob:
    name: str
    address: str
    host: str
    pid: int
    run_id: str
    token: str | None

    def url(self, path: str) -> str:
        return f"{self.address}/jobs/{quote(self.name, safe='')}{path}"


def locate(directory: str, job: str, storage_options: dict | None = None, token: str | None = None,
           address: str | None = None) -> RunningJob:
    """The running job under DIR, from its lease; ControlError if it is not running, or
    if the lease's REST address is not one to trust (see the module's docstring)."""
    from sparkpoint.errors import StorageError
    from sparkpoint.storage.fs import StorageFS
    from sparkpoint.storage.layout import JobLayout
    from sparkpoint.storage.lease import read_current_lease

    try:
        fs = StorageFS.from_url(directory, storage_options)
        record = read_current_lease(fs, JobLayout(f"{fs.root}/{job}"))
    except (StorageError, OSError) as e:
        raise ControlError(f"cannot read the lease of job {job!r} under {directory}: {e}") from None
    if record is None:
        raise ControlError(f"job {job!r} is not running: it never ran with checkpoints in {directory}")
    now = int(time.time() * 1000)
    if record.released:
        raise ControlError(f"job {job!r} is not running: its last run ({record.run_id} on {record.host}, "
                           f"pid {record.pid}) ended at {_iso(record.heartbeat_ms)}")
    if not record.is_live(now):
        raise ControlError(f"job {job!r} is not running: its last run ({record.run_id} on {record.host}, "
                           f"pid {record.pid}) stopped renewing its lease at {_iso(record.heartbeat_ms)}")
    if not record.rest_address:
        raise ControlError(f"job {job!r} runs on {record.host} (pid {record.pid}) without a REST API "
                           f"(rest.enabled=false?); `kill -USR1 {record.pid}` there takes a checkpoint")
    rest_address = record.rest_address.rstrip("/")
    _check_trusted(job, record, rest_address, address)
    return RunningJob(job, rest_address, record.host, record.pid, record.run_id,
                      token or os.environ.get("SPARKPOINT_REST_TOKEN") or read_control_token(record.run_id))


def _check_trusted(job: str, record: Any, rest_address: str, address: str | None) -> None:
    if address is not None:
        if address.rstrip("/").lower() != rest_address.lower():
            raise ControlError(f"the lease of job {job!r} names REST address {rest_address}, not {address} "
                               f"(--address): not sending it anything")
        return
    where = urlsplit(rest_address)
    try:
        port = where.port or 80
    except ValueError:
        port = None
    if where.scheme != "http" or not where.hostname or not is_loopback(where.hostname) or port is None:
        raise ControlError(f"job {job!r} serves its REST API at {rest_address} (from its lease), which is not "
                           f"this machine's loopback; if that is the job, pass --address {rest_address}")
    if record.host != socket.gethostname():
        raise ControlError(f"job {job!r} runs on host {record.host} (pid {record.pid}); its REST API at "
                           f"{rest_address} answers there only: run this command on {record.host}")
    if _serves(record.pid, record.pidns, port) is False:
        raise ControlError(f"{rest_address} is not served by the process of job {job!r} (pid {record.pid}) on this host: "
                           f"not sending it anything; is the job still running?")


def _serves(pid: int, pidns: str | None, port: int) -> bool | None:
    """Whether process `pid` listens on TCP `port` here (Linux /proc); None where that
    cannot be told (no /proc, another PID namespace, another user's process)."""
    try:
        if pidns is not None and os.readlink("/proc/self/ns/pid") != pidns:
            return None
        inodes = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as f:
                    rows = f.read().splitlines()[1:]
            except FileNotFoundError:
                continue
            for row in rows:
                fields = row.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(fields[9])
        fds = os.listdir(f"/proc/{pid}/fd")
    except (OSError, ValueError, IndexError):
        return None
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def _iso(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def call(job: RunningJob, method: str, path: str, body: dict | None = None, timeout_s: float = 10.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(job.url(path), data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    if job.token:
        request.add_header("Authorization", f"Bearer {job.token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            errors = json.loads(e.read()).get("errors") or [e.reason]
        except ValueError:
            errors = [e.reason]
        hint = ""
        if e.code == 401 and not job.token:
            hint = (f" (this user cannot read the job's control token {control_token_path(job.run_id)}: run the "
                    f"command as the job's user, or pass --token)")
        raise ControlError(f"job {job.name!r} at {job.address}: {e.code} {'; '.join(map(str, errors))}{hint}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ControlError(f"job {job.name!r} does not answer at {job.address} (host {job.host}, pid {job.pid}): "
                           f"{reason}") from None


def wait_for(job: RunningJob, path: str, timeout_s: float, gone_ok: bool = False) -> dict[str, Any]:
    """Poll an asynchronous request until it completed; its `operation`. With `gone_ok`,
    a server that went away (the job stopped) counts as done with no location."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = call(job, "GET", path)
        except ControlError:
            if gone_ok:
                return {}
            raise
        if answer["status"]["id"] == "COMPLETED":
            operation = answer.get("operation") or {}
            cause = operation.get("failure-cause")
            if cause:
                raise ControlError(f"job {job.name!r}: {answer.get('kind', 'request')} failed: "
                                   f"{cause.get('class')}: {cause.get('message')}")
            return operation
        if time.monotonic() > deadline:
            raise ControlError(f"job {job.name!r}: no answer within {timeout_s:g} s; request {path} is still "
                               f"in progress (ask again with the REST API)")
        time.sleep(_POLL_S)


# ------------------------------------------------------------------------------ commands
def _common(fn):
    for option in reversed([
        click.option("--checkpoint-dir", "directory", required=True, metavar="DIR",
                     help="the job's execution.checkpointing.dir"),
        click.option("--job", required=True, metavar="NAME", help="the job's pipeline.name"),
        click.option("--json", "as_json", is_flag=True, help="print JSON"),
        click.option("--token", default=None, envvar="SPARKPOINT_REST_TOKEN",
                     help="the job's rest.token, if it has one (or SPARKPOINT_REST_TOKEN)"),
        click.option("--address", default=None, envvar="SPARKPOINT_REST_ADDRESS", metavar="URL",
                     help="the job's REST address when it is not on this machine's loopback: the lease must "
                          "name this one (or SPARKPOINT_REST_ADDRESS)"),
        click.option("--storage-options", default=None, metavar="JSON", help="fsspec options for DIR"),
    ]):
        fn = option(fn)
    return fn


def _run(fn, *args: Any) -> None:
    try:
        fn(*args)
    except ControlError as e:
        click.echo(f"sparkpoint: error: {e}", err=True)
        sys.exit(1)


def _options(raw: str | None) -> dict | None:
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise click.BadParameter(f"--storage-options must be a JSON object ({e})") from None
    if not isinstance(value, dict):
        raise click.BadParameter("--storage-options must be a JSON object")
    return value


def _bytes(n: Any) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}TB"


@click.command()
@_common
def status(directory: str, job: str, as_json: bool, token: str | None, address: str | None,
           storage_options: str | None) -> None:
    """Status, throughput, lag, watermark and checkpoints of a running job."""
    def go() -> None:
        target = locate(directory, job, _options(storage_options), token, address)
        overview = call(target, "GET", "")
        checkpoints = call(target, "GET", "/checkpoints")
        if as_json:
            click.echo(json.dumps({"address": target.address, "host": target.host, "pid": target.pid,
                                   "job": overview, "checkpoints": {k: checkpoints[k] for k in
                                                                    ("counts", "summary", "latest")}},
                                  indent=2, default=str))
            return
        o, c = overview, checkpoints["counts"]
        last = checkpoints["latest"]["completed"]
        failed = checkpoints["latest"]["failed"]
        click.echo(f"job {o['name']} {o['state']} (run {o['run-id']}, host {target.host}, pid {target.pid}) "
                   f"at {target.address}")
        click.echo(f"  epoch {o['epoch']} | records in {o['records-in']:,} ({o['records-in-per-second']:,.0f}/s) "
                   f"| out {o['records-out']:,} | lag {o['lag']:,} | watermark "
                   f"{o['watermark'] if o['watermark'] is not None else '-'} | restarts {o['restarts']}")
        click.echo(f"  checkpoints: {c['completed']} completed, {c['failed']} failed, {c['in_progress']} in "
                   f"progress, {c['restored']} restored")
        if last:
            click.echo(f"  last completed: #{last['id']} in {(last.get('end_to_end_duration') or 0) / 1000:.2f}s, "
                       f"{_bytes(last.get('state_size'))}")
        if failed:
            click.echo(f"  last failed: #{failed['id']} {failed.get('failure_reason')}: "
                       f"{failed.get('failure_message') or ''}")

    _run(go)


@click.command()
@_common
@click.option("--timeout", default=600.0, show_default=True, help="seconds to wait for the checkpoint")
def checkpoint(directory: str, job: str, as_json: bool, token: str | None, address: str | None,
               storage_options: str | None, timeout: float) -> None:
    """Take a checkpoint of a running job now (like `kill -USR1 <pid>`), and wait for it."""
    def go() -> None:
        target = locate(directory, job, _options(storage_options), token, address)
        request_id = call(target, "POST", "/checkpoints", {})["request-id"]
        operation = wait_for(target, f"/checkpoints/{request_id}", timeout)
        cid = operation.get("checkpointId")
        click.echo(json.dumps({"checkpoint_id": cid}) if as_json else f"checkpoint {cid} completed")

    _run(go)


@click.command()
@_common
@click.option("--target", default=None, metavar="PATH", help="where to write it (default: the job's savepoint dir)")
@click.option("--timeout", default=600.0, show_default=True, help="seconds to wait for the savepoint")
def savepoint(directory: str, job: str, as_json: bool, token: str | None, address: str | None,
              storage_options: str | None, target: str | None, timeout: float) -> None:
    """Take a savepoint of a running job; prints its path."""
    def go() -> None:
        running = locate(directory, job, _options(storage_options), token, address)
        body = {"target-directory": target} if target else {}
        request_id = call(running, "POST", "/savepoints", body)["request-id"]
        location = wait_for(running, f"/savepoints/{request_id}", timeout).get("location")
        click.echo(json.dumps({"savepoint": location}) if as_json else location)

    _run(go)


@click.command()
@_common
@click.option("--savepoint", "savepoint_to", is_flag=False, flag_value="", default=None, metavar="[PATH]",
              help="take a final savepoint (at PATH, or the job's default) before stopping")
@click.option("--timeout", default=600.0, show_default=True, help="seconds to wait for the job to stop")
def stop(directory: str, job: str, as_json: bool, token: str | None, address: str | None,
         storage_options: str | None, savepoint_to: str | None, timeout: float) -> None:
    """Stop a running job, with or without a final savepoint; prints the savepoint's path."""
    def go() -> None:
        running = locate(directory, job, _options(storage_options), token, address)
        body: dict[str, Any] = {"savepoint": savepoint_to is not None}
        if savepoint_to:
            body["target-directory"] = savepoint_to
        request_id = call(running, "POST", "/stop", body)["request-id"]
        # Without a savepoint the server may be gone before we ask: the job stopped.
        operation = wait_for(running, f"/savepoints/{request_id}", timeout, gone_ok=savepoint_to is None)
        location = operation.get("location")
        if as_json:
            click.echo(json.dumps({"stopped": True, "savepoint": location}))
        else:
            click.echo(location if location else f"job {job} stopped")

    _run(go)


def register(group: click.Group) -> None:
    for command in (status, checkpoint, savepoint, stop):
        group.add_command(command)
