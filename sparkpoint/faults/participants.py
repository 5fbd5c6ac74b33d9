"""Participant faults for rehearsing checkpoint failures on a real pipeline:
an error in the synchronous part, an error in the asynchronous part, a lost ack,
a slow ack. Configured with the same `sparkpoint.faults` list as storage faults
(rules with a "participant" key are participant faults), e.g. in YAML:

    sparkpoint.faults:
      - {participant: "state:*", action: async_error, checkpoints: [3, 4]}
      - {participant: "state:*/1", action: sync_error, checkpoints: [5]}
      - {participant: "sink:*", action: slow_ack, seconds: 5}
      - {participant: "state:*/0", action: lose_ack, times: 1}

`checkpoints` omitted = every checkpoint; `times` bounds how often a rule fires.
"""

from __future__ import annotations

import fnmatch
import threading
from dataclasses import dataclass
from typing import Any, Iterable

from sparkpoint.errors import ConfigError

ACTIONS = ("sync_error", "async_error", "lose_ack", "slow_ack", "slow_restore")


class InjectedFault(Exception):
    pass


@dataclass
class ParticipantRule:
    participant: str
    action: str
    checkpoints: frozenset[int] | None = None
    seconds: float = 0.0
    times: int | None = None
    fired: int = 0

    def matches(self, participant: str, checkpoint_id: int | None) -> bool:
        if checkpoint_id is None or not fnmatch.fnmatchcase(participant, self.participant):
            return False
        if self.checkpoints is not None and checkpoint_id not in self.checkpoints:
            return False
        return self.times is None or self.fired < self.times


class ParticipantFaults:
    def __init__(self, rules: Iterable[ParticipantRule] = ()):
        self._rules = list(rules)
        self._lock = threading.Lock()

    @classmethod
    def from_rules(cls, raw: Iterable[dict[str, Any]]) -> "ParticipantFaults":
        rules = []
        for r in raw or []:
            if "participant" not in r:
                continue  # a storage rule (sparkpoint.faults.storage)
            action = r.get("action")
            if action not in ACTIONS:
                raise ConfigError(f"sparkpoint.faults: participant rule {r!r}: action must be one of {ACTIONS}")
            unknown = set(r) - {"participant", "action", "checkpoints", "seconds", "times"}
            if unknown:
                raise ConfigError(f"sparkpoint.faults: participant rule {r!r}: unknown fields {sorted(unknown)}")
            cps = r.get("checkpoints")
            rules.append(ParticipantRule(str(r["participant"]), action,
                                         frozenset(int(c) for c in cps) if cps is not None else None,
                                         float(r.get("seconds", 0)), r.get("times")))
        return cls(rules)

    def add(self, rule: ParticipantRule) -> None:
        with self._lock:
            self._rules.append(rule)

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def _fire(self, participant: str, checkpoint_id: int | None, action: str) -> ParticipantRule | None:
        with self._lock:
            for rule in self._rules:
                if rule.action == action and rule.matches(participant, checkpoint_id):
                    rule.fired += 1
                    return rule
        return None

    # -- hooks used by the runtime --------------------------------------------------
    def sync_failures(self, checkpoint_id: int | None, participants: list[str]) -> tuple[int, ...]:
        """Indices of stateful subtasks whose synchronous part must fail (the failure is
        raised inside the Spark worker, where that part runs)."""
        if checkpoint_id is None:
            return ()
        return tuple(i for i, p in enumerate(participants) if self._fire(p, checkpoint_id, "sync_error"))

    def check_sync(self, participant: str, checkpoint_id: int) -> None:
        if self._fire(participant, checkpoint_id, "sync_error"):
            raise InjectedFault(f"injected fault: synchronous part of {participant} for checkpoint {checkpoint_id}")

    def before_async(self, participant: str, checkpoint_id: int, cancel: threading.Event) -> None:
        slow = self._fire(participant, checkpoint_id, "slow_ack")
        if slow:
            cancel.wait(slow.seconds)
        if self._fire(participant, checkpoint_id, "async_error"):
            raise InjectedFault(f"injected fault: asynchronous part of {participant} for checkpoint {checkpoint_id}")

    def before_restore(self, participant: str) -> None:
        """`slow_restore` keeps a participant RESTORING for `seconds` (seed 002 rehearsal);
        restore rules match any checkpoint id."""
        with self._lock:
            rule = next((r for r in self._rules if r.action == "slow_restore"
                         and fnmatch.fnmatchcase(participant, r.participant)
                         and (r.times is None or r.fired < r.times)), None)
            if rule:
                rule.fired += 1
        if rule:
            import time

            time.sleep(rule.seconds)

    def lose_ack(self, participant: str, checkpoint_id: int) -> bool:
        return self._fire(participant, checkpoint_id, "lose_ack") is not None
