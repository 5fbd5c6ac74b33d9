"""The API reference (docs/reference.md, built from docstrings) covers what a user calls:
every name `sparkpoint` exports, and every public method of the pipeline builder and of
the stateful processor API (the processor's callbacks, its handle, the state kinds, the
timer values). A method without a docstring would be left out of the built page."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import sparkpoint

REFERENCE = Path(__file__).resolve().parents[3] / "docs" / "reference.md"
USER_CLASSES = ["Pipeline", "Stream", "StatefulProcessor", "StatefulProcessorHandle", "ValueState", "ListState", "MapState",
                "TimerValues", "ExpiredTimerInfo"]


def test_every_exported_name_has_a_place_in_the_reference() -> None:
    listed = set(re.findall(r"^::: sparkpoint\.(\w+)", REFERENCE.read_text(), re.M))
    assert sorted(set(sparkpoint.__all__) - listed) == []


def test_every_public_method_a_user_calls_or_overrides_has_a_docstring() -> None:
    undocumented = []
    for name in USER_CLASSES:
        cls = getattr(sparkpoint, name)
        if not (cls.__doc__ or "").strip():
            undocumented.append(name)
        for member, fn in vars(cls).items():
            if not member.startswith("_") and inspect.isfunction(fn) and not (fn.__doc__ or "").strip():
                undocumented.append(f"{name}.{member}")
    assert undocumented == []
