"""The names of a checkpoint's participants (no Spark here).

Every checkpoint is acked by the job (`job`: its position, runtime/position.py), each
source (`source:<name>`), each sink (`sink:<name>`) and each subtask of each stateful step
(`state:<step>/<subtask>`). The names are the keys of a checkpoint's handles
(docs/checkpoint-format.md)."""

from __future__ import annotations

from typing import Iterable

from sparkpoint.runtime.failures import JOB


def source_participant(name: str) -> str:
    return f"source:{name}"


def sink_participant(name: str) -> str:
    return f"sink:{name}"


def state_participant(step: str, subtask: int) -> str:
    return f"state:{step}/{subtask}"


def step_participants(step: str, parallelism: int) -> list[str]:
    return [state_participant(step, i) for i in range(parallelism)]


def all_participants(sources: Iterable[str], sinks: Iterable[str], steps: Iterable[str],
                     parallelism: int) -> list[str]:
    found = [JOB, *map(source_participant, sources), *map(sink_participant, sinks)]
    for step in steps:
        found += step_participants(step, parallelism)
    return found


def state_by_step(handles: dict) -> dict[str, dict[int, dict]]:
    """A checkpoint's state handles by step name and subtask (participants `state:<step>/<i>`)."""
    found: dict[str, dict[int, dict]] = {}
    for participant, handle in handles.items():
        if participant.startswith("state:"):
            step, _, subtask = participant[len("state:"):].rpartition("/")
            found.setdefault(step, {})[int(subtask)] = handle
    return found
