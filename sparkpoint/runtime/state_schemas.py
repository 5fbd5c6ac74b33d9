"""The state schemas a job records in its checkpoints, and the check at restore.

The state handle of each stateful step's subtask 0 carries the step's
`sparkpoint.state.descriptor` JSON under `state_source.SCHEMA_KEY` (once per step keeps
`_metadata` small), so a checkpoint says how its state was declared:
`read_state` reads it without the operator object, and a restore compares it with the
pipeline's steps now (`sparkpoint.state.evolution`): a compatible change is logged and
accepted, an incompatible one stops the job before anything runs. A checkpoint that
records no schema (taken by an older sparkpoint) restores unchecked.

A processor's states are what its `init(handle)` declares, so describing it runs `init`
once on the driver against a handle that only records (as `read_state` does); that
happens once per run and step.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from sparkpoint.api.state_schema import describe
from sparkpoint.errors import StateSchemaError
from sparkpoint.runtime.failures import summarize
from sparkpoint.runtime.state_source import SCHEMA_KEY
from sparkpoint.state.descriptor import OperatorStateSchema
from sparkpoint.state.evolution import check_compatible

log = logging.getLogger(__name__)


class StateSchemas:
    """The declared state schema of each step of a job, as recorded in its checkpoints."""

    def __init__(self, operators: Mapping[str, Any]):
        self.operators = operators
        self._final: dict[str, dict] = {}  # steps whose schema will not change in this run
        self._unknown: set[str] = set()

    def recorded(self, step: str) -> dict | None:
        """The JSON a checkpoint records for `step`, or None when it cannot be described."""
        if step in self._final:
            return self._final[step]
        if step in self._unknown:
            return None
        try:
            desc = describe(self.operators[step])
        except Exception as e:  # a processor whose init fails on the driver: read_state then needs the operator
            log.warning("the state schema of step %s is not recorded in its checkpoints (%s); read_state will need "
                        "the operator object to read it", step, summarize(e))
            self._unknown.add(step)
            return None
        raw = desc.to_json()
        if not desc.needs_store_meta:  # key types (and a join's or top-n's rows) known: fixed for the run
            self._final[step] = raw
        return raw

    def with_schema(self, step: str, handle: Mapping[str, Any]) -> dict:
        """`handle` with `step`'s schema recorded in it."""
        raw = self.recorded(step)
        return {**handle, SCHEMA_KEY: raw} if raw is not None else dict(handle)

    def check_restore(self, step: str, handles: Mapping[int, Mapping[str, Any]], what: str) -> None:
        """Stop (IncompatibleStateSchemaError) if `step`'s state in `handles` (its subtasks'
        handles in the checkpoint `what`) cannot be read as the step declares it now."""
        found = next((h.get(SCHEMA_KEY) for h in handles.values() if h.get(SCHEMA_KEY)), None)
        if found is None:
            log.info("%s records no state schema for step %s (taken before schemas were recorded); it restores "
                     "unchecked", what, step)
            return
        try:
            recorded = OperatorStateSchema.from_json(found)
        except StateSchemaError as e:
            log.warning("%s: the recorded state schema of step %s is unreadable (%s); it restores unchecked", what,
                        step, e)
            return
        current = self.recorded(step)
        if current is None:
            return
        for note in check_compatible(recorded, OperatorStateSchema.from_json(current), what):
            log.info("step %s: %s", step, note)
