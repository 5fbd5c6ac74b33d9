"""Durations a step is given ("10 minutes", "5 s", 3000 ms) as milliseconds, or one
ConfigError that names the option: the config keys' own parser, with the step's words."""

from __future__ import annotations

from typing import Any

from sparkpoint.errors import ConfigError


def duration_ms(value: Any, what: str) -> int:
    from sparkpoint.config import parse_duration_ms

    try:
        return parse_duration_ms(value)
    except ValueError as e:
        raise ConfigError(f"{what}: {e}") from None


def signed_duration_ms(value: Any, what: str) -> int:
    """A duration that may be negative: -5000, '-5 s' (an interval join's bounds)."""
    text = value.strip() if isinstance(value, str) else None
    negative = text is not None and text.startswith("-")
    ms = duration_ms(text[1:] if negative else value, what)  # type: ignore[index]
    return -ms if negative else ms
