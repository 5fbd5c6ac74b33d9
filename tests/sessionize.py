"""The README's sessionization processor, as written there (its block is executed),
shared by the tests that run it through the processor tester and through a job."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_processor() -> dict:
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)
    block = next(b for b in blocks if "class Sessionize(StatefulProcessor)" in b)
    namespace: dict = {"__name__": "readme_sessionize"}
    exec(compile(block, str(README), "exec"), namespace)
    return namespace


_README = _readme_processor()
Sessionize = _README["Sessionize"]
GAP_MS: int = _README["GAP_MS"]
