"""Names for what tests create on the run's shared servers."""

from __future__ import annotations

import itertools
import re

_names = itertools.count(1)


def unique_name(stem: str) -> str:
    """A name no other test of this run gets, valid as a Kafka topic, a consumer group
    and an S3 bucket: lower case, `[a-z0-9-]`, at most 50 characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")[:40].strip("-") or "t"
    return f"{slug}-{next(_names)}"
