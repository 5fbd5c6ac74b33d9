"""Storage fault injection: rehearse checkpoint-storage failures from tests or config.

A rule says *which* storage operations misbehave and *how*:

    {"op": "upload", "path": "*/chk-*/**", "checkpoints": [3, 4], "action": "fail", "times": 1}

- op: write | create_exclusive | upload | read | delete | mkdir | list | any
  (read = content reads: read_bytes, get_file, sha256; list = ls, find, exists, size, stat)
- path: a glob matched against the full storage path and against the path relative to
  the checkpoint root, which starts with the job name ("orders/chk-3/_metadata"); `*`
  also crosses `/`. Or a regex (searched) with a "re:" prefix or as `path_regex`.
- checkpoints: ids parsed from the `chk-<id>` directory in the path; omitted/null = any path.
- action: "fail" (raise StorageError "injected fault: ..."), "slow" with "seconds"
  (or "slow(2.5)"), or "truncate": the operation *succeeds* with the first half of the
  bytes (a torn write / short read), which verification must catch.
- times: how often the rule fires before it retires; omitted/null = unlimited.
- duration: seconds; the rule fires from its first match until `duration` seconds
  later, then retires: an outage of that length (e.g. during a restore), however many
  calls fall into it. Counted from the first match in each process that applies it, or,
  with `window_file` (a local path), from the first match in any process on this machine
  (the driver and Spark's Python workers): the first one writes the start into the file.

Rules are checked in insertion order; the first match fires. They can be added and
removed while the job runs (thread-safe). In the `sparkpoint.faults` config list,
rules with a "participant" key are participant faults and are skipped here.
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Iterable, Mapping

import yaml

from sparkpoint.errors import ConfigError, StorageError
from sparkpoint.storage.fs import FileStat, StorageFS
from sparkpoint.storage.layout import checkpoint_id_in_path


class FaultOp(str, Enum):
    WRITE = "write"
    CREATE_EXCLUSIVE = "create_exclusive"
    UPLOAD = "upload"
    READ = "read"
    DELETE = "delete"
    MKDIR = "mkdir"
    LIST = "list"
    ANY = "any"


class FaultKind(str, Enum):
    FAIL = "fail"
    SLOW = "slow"
    TRUNCATE = "truncate"


@dataclass(frozen=True)
class FaultAction:
    kind: FaultKind
    seconds: float = 0.0

    @classmethod
    def parse(cls, value: Any, seconds: Any = None) -> "FaultAction":
        if isinstance(value, Mapping) and len(value) == 1:
            (name, arg), = value.items()
            return cls.parse(name, arg)
        text = str(value).strip().lower()
        m = re.fullmatch(r"slow\(\s*([0-9.]+)\s*\)", text)
        if m:
            return cls(FaultKind.SLOW, float(m.group(1)))
        try:
            kind = FaultKind(text)
        except ValueError:
            raise ConfigError(f"fault action {value!r} is unknown; use one of "
                              f"{[k.value for k in FaultKind]} or 'slow(<seconds>)'") from None
        if kind is FaultKind.SLOW:
            if seconds is None:
                raise ConfigError("fault action 'slow' needs 'seconds' (e.g. {'action': 'slow', "
                                  "'seconds': 2}) or the form 'slow(2)'")
            return cls(kind, float(seconds))
        return cls(kind)


_ids = itertools.count(1)
_RULE_KEYS = {"op", "path", "path_regex", "checkpoints", "action", "seconds", "times", "duration", "window_file",
              "name"}


@dataclass
class FaultRule:
    op: FaultOp
    action: FaultAction
    path: str | None = None  # glob
    path_regex: str | None = None
    checkpoints: frozenset[int] | None = None
    times: int | None = None  # remaining firings; None = unlimited
    name: str = field(default_factory=lambda: f"rule-{next(_ids)}")
    duration: float | None = None  # seconds from the first firing; then the rule retires
    began: float | None = None  # clock reading of the first firing (with `duration`)
    window_file: str | None = None  # with `duration`: the first firing's wall-clock time, for every process

    def window_began(self) -> float | None:
        """Wall-clock start of the outage as the first firing process recorded it."""
        try:
            with open(self.window_file) as f:
                text = f.read().strip()
            return float(text) if text else None
        except (OSError, ValueError):
            return None

    def start_window(self, now: float) -> None:
        """Record `now` as the outage's start unless another process did first."""
        try:
            fd = os.open(self.window_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as f:
            f.write(repr(now))

    def __post_init__(self) -> None:
        if self.path is not None and self.path.startswith("re:"):
            self.path_regex, self.path = self.path[3:], None
        self._regex = re.compile(self.path_regex) if self.path_regex is not None else None

    def matches(self, op: FaultOp, path: str, relative_path: str, now: float | None = None) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.duration is not None and now is not None:
            began = self.window_began() if self.window_file else self.began
            if began is not None and now - began >= self.duration:
                return False
        if self.op is not FaultOp.ANY and self.op is not op:
            return False
        if self.path is not None and not (fnmatch.fnmatchcase(path, self.path)
                                          or fnmatch.fnmatchcase(relative_path, self.path)):
            return False
        if self._regex is not None and not (self._regex.search(path) or self._regex.search(relative_path)):
            return False
        if self.checkpoints is not None and checkpoint_id_in_path(path) not in self.checkpoints:
            return False
        return True

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "FaultRule":
        unknown = set(config) - _RULE_KEYS
        if unknown:
            raise ConfigError(f"fault rule has unknown keys {sorted(unknown)}; accepted: {sorted(_RULE_KEYS)}")
        try:
            op = FaultOp(str(config.get("op", "any")).lower())
        except ValueError:
            raise ConfigError(f"fault rule op {config.get('op')!r} is unknown; use one of "
                              f"{[o.value for o in FaultOp]}") from None
        if "action" not in config:
            raise ConfigError(f"fault rule {dict(config)!r} has no 'action' (fail, slow, truncate)")
        checkpoints = config.get("checkpoints")
        if checkpoints is not None:
            checkpoints = frozenset(int(c) for c in (checkpoints if isinstance(checkpoints, list)
                                                     else [checkpoints]))
        times = config.get("times")
        if times in (None, "unlimited"):
            times = None
        elif not isinstance(times, int) or times < 1:
            raise ConfigError(f"fault rule times={times!r} must be a positive integer or 'unlimited'")
        kwargs: dict[str, Any] = {}
        if config.get("duration") is not None:
            duration = float(config["duration"])
            if duration <= 0:
                raise ConfigError(f"fault rule duration={config['duration']!r} must be a positive number of seconds")
            kwargs["duration"] = duration
        if config.get("window_file") is not None:
            if config.get("duration") is None:
                raise ConfigError("fault rule window_file needs a duration (the outage's length in seconds)")
            kwargs["window_file"] = str(config["window_file"])
        if "name" in config:
            kwargs["name"] = str(config["name"])
        return cls(op=op, action=FaultAction.parse(config["action"], config.get("seconds")),
                   path=config.get("path"), path_regex=config.get("path_regex"),
                   checkpoints=checkpoints, times=times, **kwargs)


def parse_fault_rules(config: str | Mapping[str, Any] | Iterable[Mapping[str, Any]]) -> list[FaultRule]:
    """Rules from a JSON/YAML string, one rule dict, a list of them, or {"rules": [...]}."""
    if isinstance(config, str):
        try:
            config = yaml.safe_load(config)
        except yaml.YAMLError as e:
            raise ConfigError(f"fault rules are not valid JSON/YAML: {e}") from e
    if config is None:
        return []
    if isinstance(config, Mapping):
        config = config["rules"] if set(config) == {"rules"} else [config]
    rules = []
    for item in config:
        if not isinstance(item, Mapping):
            raise ConfigError(f"a fault rule must be a mapping, got {item!r}")
        if "participant" in item:
            continue  # a participant fault (faults/participants.py) in the same list
        rules.append(FaultRule.from_config(item))
    return rules


@dataclass(frozen=True)
class FiredFault:
    rule: str
    op: FaultOp
    path: str
    action: FaultAction


class FaultyStorageFS(StorageFS):
    """A StorageFS that misbehaves according to its rules; otherwise delegates to `inner`."""

    def __init__(self, inner: StorageFS, rules: Iterable[FaultRule | Mapping[str, Any]] = (),
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time):
        super().__init__(inner.fs, inner.root)
        self.inner = inner
        self._sleep = sleep
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []
        self.fired: list[FiredFault] = []
        for rule in rules:
            self.add_rule(rule)

    @classmethod
    def from_config(cls, inner: StorageFS, config: Any, **kwargs: Any) -> "FaultyStorageFS":
        return cls(inner, parse_fault_rules(config), **kwargs)

    # -- rules ---------------------------------------------------------------------
    def add_rule(self, rule: FaultRule | Mapping[str, Any]) -> str:
        if not isinstance(rule, FaultRule):
            rule = FaultRule.from_config(rule)
        with self._lock:
            self._rules.append(rule)
        return rule.name

    def remove_rule(self, name: str) -> bool:
        with self._lock:
            before = len(self._rules)
            self._rules = [r for r in self._rules if r.name != name]
            return len(self._rules) < before

    def clear_rules(self) -> None:
        with self._lock:
            self._rules.clear()

    @property
    def rules(self) -> list[FaultRule]:
        with self._lock:
            return list(self._rules)

    def _inject(self, op: FaultOp, path: str) -> FaultAction | None:
        """Fire the first matching rule: raise for fail, sleep for slow, or return a
        truncate action for the caller to apply."""
        relative = path[len(self.root) + 1:] if path.startswith(self.root + "/") else path
        with self._lock:
            now, wall = self._clock(), self._wall_clock()
            rule = next((r for r in self._rules
                         if r.matches(op, path, relative, wall if r.window_file else now)), None)
            if rule is None:
                return None
            if rule.times is not None:
                rule.times -= 1
            if rule.window_file:
                rule.start_window(wall)
            elif rule.duration is not None and rule.began is None:
                rule.began = now
            self.fired.append(FiredFault(rule.name, op, path, rule.action))
        if rule.action.kind is FaultKind.FAIL:
            raise StorageError(f"injected fault: {op.value} of {path} failed (rule {rule.name})")
        if rule.action.kind is FaultKind.SLOW:
            self._sleep(rule.action.seconds)
            return None
        return rule.action

    # -- metadata operations ("list") -----------------------------------------------
    def exists(self, path: str) -> bool:
        self._inject(FaultOp.LIST, path)
        return self.inner.exists(path)

    def ls(self, path: str) -> list[str]:
        self._inject(FaultOp.LIST, path)
        return self.inner.ls(path)

    def find(self, path: str) -> list[FileStat]:
        self._inject(FaultOp.LIST, path)
        return self.inner.find(path)

    def size(self, path: str) -> int:
        self._inject(FaultOp.LIST, path)
        return self.inner.size(path)

    def stat(self, path: str) -> FileStat:
        self._inject(FaultOp.LIST, path)
        return self.inner.stat(path)

    # -- content reads ----------------------------------------------------------------
    def read_bytes(self, path: str) -> bytes:
        truncate = self._inject(FaultOp.READ, path)
        data = self.inner.read_bytes(path)
        return data[: len(data) // 2] if truncate else data

    def sha256(self, path: str) -> str:
        if self._inject(FaultOp.READ, path):
            data = self.inner.read_bytes(path)
            return hashlib.sha256(data[: len(data) // 2]).hexdigest()
        return self.inner.sha256(path)

    def get_file(self, path: str, local_path: str) -> None:
        truncate = self._inject(FaultOp.READ, path)
        self.inner.get_file(path, local_path)
        if truncate:
            os.truncate(local_path, os.path.getsize(local_path) // 2)

    # -- writes -----------------------------------------------------------------------
    def makedirs(self, path: str) -> None:
        self._inject(FaultOp.MKDIR, path)
        self.inner.makedirs(path)

    def put_file(self, local_path: str, path: str) -> None:
        if not self._inject(FaultOp.UPLOAD, path):
            self.inner.put_file(local_path, path)
            return
        with open(local_path, "rb") as f:
            data = f.read()
        fd, torn = tempfile.mkstemp(prefix="sparkpoint-torn-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data[: len(data) // 2])
            self.inner.put_file(torn, path)
        finally:
            os.unlink(torn)

    def write_atomic(self, path: str, data: bytes) -> None:
        truncate = self._inject(FaultOp.WRITE, path)
        self.inner.write_atomic(path, data[: len(data) // 2] if truncate else data)

    def create_exclusive(self, path: str, data: bytes) -> None:
        truncate = self._inject(FaultOp.CREATE_EXCLUSIVE, path)
        self.inner.create_exclusive(path, data[: len(data) // 2] if truncate else data)

    def rm(self, path: str, recursive: bool = False) -> None:
        self._inject(FaultOp.DELETE, path)
        self.inner.rm(path, recursive=recursive)
