"""Fault injection: rehearse failures on a real job, from tests, the demo, or config.

One `sparkpoint.faults` list configures both kinds (docs/faults.md):

    storage       rules without a "participant" key: FaultyStorageFS wraps checkpoint
                  storage and fails, slows or truncates matching operations
    participants  rules with a "participant" key: a snapshot part errors, an ack is
                  lost or slow, a restore is slow

A feature, not test scaffolding: production code imports it from here, never from
`sparkpoint.testing`.
"""

from sparkpoint.faults.participants import InjectedFault, ParticipantFaults, ParticipantRule
from sparkpoint.faults.storage import (
    FaultAction,
    FaultKind,
    FaultOp,
    FaultRule,
    FaultyStorageFS,
    FiredFault,
    parse_fault_rules,
)

__all__ = [
    "FaultAction", "FaultKind", "FaultOp", "FaultRule", "FaultyStorageFS", "FiredFault", "parse_fault_rules",
    "InjectedFault", "ParticipantFaults", "ParticipantRule",
]
