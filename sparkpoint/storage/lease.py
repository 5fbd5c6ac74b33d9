"""The job lease: one run at a time per checkpoint namespace (seed 003).

Protocol
--------
The lease is a directory `<job>/_lease/` of records, one file per *fencing token*
(`_lease/00000000000000000007`), each a JSON `LeaseRecord`: run id, host, pid, when it
was acquired, its last heartbeat, its ttl, and whether it was released. The record
with the highest token is the lease; lower tokens are history.

acquire   List the tokens and read the highest record. If it is live (not released,
          last heartbeat + ttl still ahead) and not ours: refuse with LeaseHeldError
          saying who holds it and how to take over. Otherwise create token+1 with an
          *exclusive create* (link(2) on local/NFS, `If-None-Match: *` on S3). Of two
          runs starting at the same moment exactly one creates the file; the other gets
          FileExistsError, reads the winner's record and is refused with LeaseHeldError.
heartbeat Verify no higher token exists (else LeaseLostError: we were fenced out), then
          rewrite *our own* token file with a fresh heartbeat. Nobody else writes it,
          so renewals never race with takeovers.
check     Before every `_metadata` commit. Fails with LeaseLostError if a higher token
          exists (a proven takeover: this run must stop), or with LeaseLapsedError if our
          last successful heartbeat is older than 3/4 of the ttl: a holder that cannot
          renew pauses committing *before* anyone may take over (contenders wait the full
          ttl), so two runs never commit side by side even when the newer one's token
          file is not yet visible to the older one. A lapse is not fatal: processing goes
          on, and the first heartbeat that reaches storage again *re-acquires* with an
          exclusive create of token+1. If a contender took over meanwhile, it owns that
          token (or a higher one) and we are fenced; otherwise the contender's create of
          the same token fails and we hold the lease again. Either way exactly one run
          may commit.
release   On clean shutdown: mark our record released, so the next run starts at once.

Clocks: this run's own trust window is measured on the monotonic clock (an NTP step
cannot stretch it); expiry compares the holder's recorded heartbeat (its wall clock) with
the contender's wall clock, so the ttl must exceed any clock skew between hosts (30 s
default; keep hosts on NTP). On NFS, mount with `lookupcache=positive` (or `actimeo=0`)
so a new token file is seen promptly.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

from sparkpoint.errors import LeaseHeldError, LeaseLapsedError, LeaseLostError, StorageError
from sparkpoint.storage.fs import StorageFS
from sparkpoint.storage.layout import JobLayout, parse_lease_token_name

log = logging.getLogger(__name__)

LEASE_FORMAT = "sparkpoint-lease"
# Fraction of the ttl after the last heartbeat during which the holder still trusts its
# lease; the remaining quarter is the safety gap before a contender may take over.
_SELF_TRUST_FRACTION = 0.75
_KEPT_HISTORY = 1  # older token files kept for `sparkpoint doctor`


@dataclass(frozen=True)
class LeaseRecord:
    job_name: str
    run_id: str
    host: str
    pid: int
    token: int
    acquired_ms: int
    heartbeat_ms: int
    ttl_ms: int
    released: bool = False
    # The holder's PID namespace: a pid means nothing across containers that share a
    # hostname, so "holder's process is gone" is judged only inside the same namespace.
    pidns: str | None = None
    # Where the holder serves its REST API ("http://127.0.0.1:8081"): how `sparkpoint
    # status/checkpoint/savepoint/stop` reach the running job. None: no server (yet).
    rest_address: str | None = None

    @property
    def expires_at_ms(self) -> int:
        return self.heartbeat_ms + self.ttl_ms

    def is_live(self, now_ms: int) -> bool:
        return not self.released and now_ms < self.expires_at_ms

    def encode(self) -> bytes:
        return json.dumps({"format": LEASE_FORMAT, "version": 1, **asdict(self)}, indent=1).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "LeaseRecord":
        doc = json.loads(raw)
        if doc.get("format") != LEASE_FORMAT:
            raise ValueError(f"not a sparkpoint lease record: {doc!r:.200}")
        return cls(job_name=str(doc["job_name"]), run_id=str(doc["run_id"]), host=str(doc["host"]),
                   pid=int(doc["pid"]), token=int(doc["token"]), acquired_ms=int(doc["acquired_ms"]),
                   heartbeat_ms=int(doc["heartbeat_ms"]), ttl_ms=int(doc["ttl_ms"]),
                   released=bool(doc.get("released", False)), pidns=doc.get("pidns"),
                   rest_address=doc.get("rest_address"))

    def to_dict(self) -> dict:
        return {**asdict(self), "expires_at_ms": self.expires_at_ms}


def _iso(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def lease_tokens(fs: StorageFS, layout: JobLayout) -> list[int]:
    return sorted(t for t in (parse_lease_token_name(n) for n in fs.ls(layout.lease)) if t is not None)


def read_lease_record(fs: StorageFS, layout: JobLayout, token: int) -> LeaseRecord:
    """A token's record. An unreadable record (edited by hand, foreign) counts as held by
    an unknown run since the file's modification time, so it expires after a default ttl
    instead of blocking the job forever or being ignored at once."""
    path = layout.lease_token(token)
    raw = fs.read_bytes(path)
    try:
        return LeaseRecord.decode(raw)
    except (ValueError, KeyError, TypeError) as e:
        modified = fs.stat(path).modified or 0.0
        log.warning("lease record %s is unreadable (%s); treating it as held by an unknown run", path, e)
        ms = int(modified * 1000)
        return LeaseRecord(job_name=layout.job_name, run_id="<unreadable lease record>", host="?",
                           pid=-1, token=token, acquired_ms=ms, heartbeat_ms=ms, ttl_ms=30_000)


def read_current_lease(fs: StorageFS, layout: JobLayout) -> LeaseRecord | None:
    """The record with the highest token, or None if this job never held a lease."""
    tokens = lease_tokens(fs, layout)
    return read_lease_record(fs, layout, tokens[-1]) if tokens else None


def describe_holder(record: LeaseRecord, now_ms: int, checkpoint_dir: str | None = None) -> str:
    """Who holds the lease and what to do about it. A holder that renews its lease is
    running: the way forward is to stop it, not to wait (it renews for as long as it runs)."""
    wait_s = max(0, (record.expires_at_ms - now_ms + 999) // 1000)
    silent_s = (now_ms - record.heartbeat_ms) / 1000
    head = (f"job {record.job_name!r} is held by run {record.run_id} (host {record.host}, "
            f"pid {record.pid}, lease token {record.token}) since {_iso(record.acquired_ms)}")
    if silent_s * 1000 <= record.ttl_ms / 2:
        where = checkpoint_dir or "<checkpoint dir>"
        return (f"{head}. That run is still running (it renewed its lease {silent_s:.0f} s ago, "
                f"and renews it for as long as it runs). To stop it: `sparkpoint stop --checkpoint-dir "
                f"{where} --job {record.job_name}` (it takes a last checkpoint, so this run resumes from it), "
                f"or Ctrl-C / kill -TERM {record.pid} on host {record.host}; to run a second copy beside it, "
                f"start it under another job name (pipeline.name)")
    return (f"{head}; it has not renewed its lease for {silent_s:.0f} s (crashed, or it lost checkpoint "
            f"storage): the lease expires at {_iso(record.expires_at_ms)} (in {wait_s} s) and the next "
            f"run takes over then. If it is still running (host {record.host}, pid {record.pid}), stop it "
            f"first, or start this job under another job name")


def storage_dir_of(fs: StorageFS, layout: JobLayout) -> str:
    """The checkpoint directory as a user passes it (`--checkpoint-dir`), from a job's layout."""
    parent = layout.root.rstrip("/").rsplit("/", 1)[0]
    return parent if fs.is_local else fs.fs.unstrip_protocol(parent)


def holder_process_gone(record: LeaseRecord, host: str | None = None, pidns: str | None = None) -> bool:
    """True if the holder ran on this host, in this PID namespace, and its process is gone
    (kill -9, OOM): it cannot commit anything any more. Other hosts' holders are judged
    by their heartbeat alone."""
    host = host if host is not None else socket.gethostname()
    pidns = pidns if pidns is not None else _own_pidns()
    if record.host != host or record.pid is None or record.pid < 0 or record.released:
        return False
    if record.pidns is None or record.pidns != pidns:
        return False  # another container with our hostname: its pids are not ours to probe
    return not _pid_running(int(record.pid))


class JobLease:
    """This run's claim on a job's checkpoint namespace. Thread-safe."""

    def __init__(self, fs: StorageFS, layout: JobLayout, run_id: str, host: str | None = None,
                 pid: int | None = None, ttl_s: float = 30.0, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] | None = None, pidns: str | None = None):
        if ttl_s <= 0:
            raise ValueError(f"lease ttl must be positive, got {ttl_s}")
        self._fs = fs
        self._layout = layout
        self.run_id = run_id
        self.host = host if host is not None else socket.gethostname()
        self.pid = pid if pid is not None else os.getpid()
        self.ttl_ms = int(ttl_s * 1000)
        self._clock = clock
        # Tests drive both clocks with one fake; real runs use time.monotonic.
        self._mono = monotonic if monotonic is not None else (time.monotonic if clock is time.time else clock)
        self.pidns = pidns if pidns is not None else _own_pidns()
        self._lock = threading.RLock()
        self._record: LeaseRecord | None = None
        self._trusted_until = 0.0
        self._lost: LeaseLostError | None = None
        self._rest_address: str | None = None

    # -- state ---------------------------------------------------------------------
    @property
    def token(self) -> int | None:
        """Our fencing token while we hold the lease."""
        record = self._record
        return record.token if record else None

    @property
    def held(self) -> bool:
        return self._record is not None and self._lost is None

    @property
    def record(self) -> LeaseRecord | None:
        return self._record

    @property
    def ttl_s(self) -> float:
        return self.ttl_ms / 1000

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- protocol ------------------------------------------------------------------
    def acquire(self) -> LeaseRecord:
        """Take the lease. Raises LeaseHeldError if another run holds a live lease,
        StorageError on I/O failure."""
        with self._lock:
            now = self._now_ms()
            tokens = lease_tokens(self._fs, self._layout)
            current = read_lease_record(self._fs, self._layout, tokens[-1]) if tokens else None
            if current is not None and current.is_live(now) and not self._holder_is_dead(current):
                if self._record is not None and current.token == self._record.token:
                    self.heartbeat()
                    return self._record
                raise LeaseHeldError(describe_holder(current, now, storage_dir_of(self._fs, self._layout)))
            token = (tokens[-1] if tokens else 0) + 1
            record = LeaseRecord(job_name=self._layout.job_name, run_id=self.run_id, host=self.host,
                                 pid=self.pid, token=token, acquired_ms=now, heartbeat_ms=now,
                                 ttl_ms=self.ttl_ms, pidns=self.pidns, rest_address=self._rest_address)
            try:
                self._fs.create_exclusive(self._layout.lease_token(token), record.encode())
            except FileExistsError:
                winner = read_lease_record(self._fs, self._layout, token)
                raise LeaseHeldError(describe_holder(winner, self._now_ms(),
                                                     storage_dir_of(self._fs, self._layout))) from None
            self._record, self._lost = record, None
            self._trust_from_now()
            if current is not None and not current.released:
                # A clean predecessor needs no word; a dead one does: this run takes its place.
                log.warning("took over job %r from run %s (host %s, pid %s), which %s; fencing token is now %d",
                            record.job_name, current.run_id, current.host, current.pid,
                            ("stopped renewing its lease (crashed, or lost checkpoint storage)"
                             if not current.is_live(now) else "is dead (its process is gone)"), token)
            self._prune_history(tokens)
            return record

    def _holder_is_dead(self, current: LeaseRecord) -> bool:
        """A holder on this very host whose process is gone (kill -9, OOM) cannot commit
        anything any more: take over at once instead of making the user wait out the ttl.
        Holders on other hosts are judged by their heartbeat alone."""
        if current.host != self.host or current.pid in (None, self.pid) or current.released:
            return False
        if current.pidns is None or current.pidns != self.pidns:
            return False  # another container with our hostname: its pids are not ours to probe
        dead = not _pid_running(int(current.pid))
        if dead:
            log.warning("lease of job %r is held by run %s, pid %s on this host, which is no longer running; "
                        "taking over without waiting for the lease to expire", current.job_name, current.run_id,
                        current.pid)
        return dead

    def publish_rest_address(self, address: str | None) -> None:
        """Record where this run serves its REST API, now (if the lease is held) and in every
        later record. Raises StorageError if the record cannot be rewritten now; the next
        heartbeat writes it then."""
        with self._lock:
            self._rest_address = address
            record = self._record
            if record is None or self._lost is not None:
                return
            updated = replace(record, rest_address=address)
            self._record = updated  # heartbeats rewrite the record from here
            self._fs.write_atomic(self._layout.lease_token(record.token), updated.encode())

    def heartbeat(self) -> None:
        """Renew. Raises LeaseLostError if a newer run took over, StorageError if the
        renewal could not be written (the lease then lapses unless a later one succeeds)."""
        with self._lock:
            record = self._require_held()
            self._raise_if_fenced(record)
            if self._lapsed():
                self._reacquire(record)
                return
            now = self._now_ms()
            renewed = replace(record, heartbeat_ms=now)
            self._fs.write_atomic(self._layout.lease_token(record.token), renewed.encode())
            self._record = renewed
            self._trust_from_now()

    def _trust_from_now(self) -> None:
        self._trusted_until = self._mono() + self.ttl_s * _SELF_TRUST_FRACTION

    def _lapsed(self) -> bool:
        return self._mono() >= self._trusted_until

    def _reacquire(self, record: LeaseRecord) -> None:
        """After a lapse a contender may have taken over: claim a fresh token exclusively.
        Whoever creates token+1 first holds the job; the other is fenced."""
        token = record.token + 1
        now = self._now_ms()
        fresh = replace(record, token=token, heartbeat_ms=now)
        try:
            self._fs.create_exclusive(self._layout.lease_token(token), fresh.encode())
        except FileExistsError:
            self._raise_if_fenced(record)  # names the run that took over
            raise
        self._record = fresh
        self._trust_from_now()
        log.warning("run %s holds the lease of job %r again (token %d) now that checkpoint storage is "
                    "reachable; checkpoints commit again", self.run_id, record.job_name, token)
        self._prune_history(lease_tokens(self._fs, self._layout)[:-1])

    def check(self) -> None:
        """Call before committing anything visible (`_metadata`). Raises LeaseLostError
        if this run may no longer act for the job."""
        with self._lock:
            record = self._require_held()
            if self._lapsed():
                now = self._now_ms()
                raise LeaseLapsedError(
                    f"run {self.run_id} could not renew its lease on job {record.job_name!r} for "
                    f"{(now - record.heartbeat_ms) / 1000:.1f} s (ttl {self.ttl_s:g} s): another run may take "
                    f"over, so this run pauses committing checkpoints. It keeps processing and commits again "
                    f"as soon as checkpoint storage is reachable and no other run has taken the job")
            self._raise_if_fenced(record)

    def release(self) -> None:
        """Give the lease up on clean shutdown. Never raises for a lease already lost."""
        with self._lock:
            record = self._record
            if record is None:
                return
            try:
                if self._lost is None and lease_tokens(self._fs, self._layout)[-1:] == [record.token]:
                    released = replace(record, heartbeat_ms=self._now_ms(), released=True)
                    self._fs.write_atomic(self._layout.lease_token(record.token), released.encode())
            except StorageError as e:
                log.warning("could not release the lease of job %r (%s); the next run waits "
                            "for it to expire (%g s)", record.job_name, e, self.ttl_s)
            finally:
                self._record = None

    # -- helpers -------------------------------------------------------------------
    def _require_held(self) -> LeaseRecord:
        if self._lost is not None:
            raise self._lost
        if self._record is None:
            raise LeaseLostError(f"run {self.run_id} does not hold the lease of job "
                                 f"{self._layout.job_name!r}; call acquire() first")
        return self._record

    def _raise_if_fenced(self, record: LeaseRecord) -> None:
        tokens = lease_tokens(self._fs, self._layout)
        newer = [t for t in tokens if t > record.token]
        if not newer:
            return
        try:
            holder = read_lease_record(self._fs, self._layout, newer[-1])
            who = f"run {holder.run_id} (host {holder.host}, pid {holder.pid})"
        except (FileNotFoundError, StorageError):
            who = "another run"
        self._lost = LeaseLostError(
            f"run {self.run_id} was fenced out of job {record.job_name!r}: {who} took the lease "
            f"with token {newer[-1]} (ours is {record.token}); this run must stop")
        raise self._lost

    def _prune_history(self, tokens_before: list[int]) -> None:
        for token in tokens_before[:-_KEPT_HISTORY] if _KEPT_HISTORY else tokens_before:
            try:
                self._fs.rm(self._layout.lease_token(token))
            except StorageError as e:  # history only; a leftover file is harmless
                log.info("could not prune old lease record %d: %s", token, e)


def _own_pidns() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed but not yet reaped process is a zombie: it runs nothing any more
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class LeaseKeeper:
    """Heartbeats a lease from a daemon thread. `on_lost` is called once, from that
    thread, when the lease is lost (fenced, or not renewable for most of its ttl)."""

    def __init__(self, lease: JobLease, on_lost: Callable[[LeaseLostError], None],
                 interval_s: float | None = None):
        self._lease = lease
        self._on_lost = on_lost
        self.interval_s = interval_s if interval_s is not None else lease.ttl_s / 4
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lapse_logged = False

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sparkpoint-lease-keeper",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def renew_once(self) -> bool:
        """One renewal; False once the lease is lost (and `on_lost` has been called)."""
        try:
            self._lease.heartbeat()
            return True
        except LeaseLostError as e:
            self._on_lost(e)
            return False
        except StorageError as e:
            log.warning("lease heartbeat failed (%s); retrying in %.1f s", e, self.interval_s)
        except FileExistsError:
            pass  # re-acquire raced a takeover; check() below names it
        try:
            self._lease.check()
        except LeaseLostError as e:
            self._on_lost(e)
            return False
        except LeaseLapsedError as e:
            if not self._lapse_logged:
                log.warning("%s", e)
                self._lapse_logged = True
            return True
        except StorageError:
            pass  # still within the trusted window; the next renewal may succeed
        self._lapse_logged = False
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.renew_once():
                return
