"""Where a test run's time goes: every test's duration (setup + call + teardown) per
directory and per file, printed at the end of the run and written as JSON to
`.cache/test-times.json` (SPARKPOINT_TEST_TIMES overrides the path). The suite's budget
is planned from it: which tier, which file, which fixture start dominates."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class TimeReport:
    def __init__(self) -> None:
        self.tests: dict[str, float] = defaultdict(float)

    def add(self, nodeid: str, seconds: float) -> None:
        self.tests[nodeid] += seconds

    def by(self, level: str) -> dict[str, float]:
        """Seconds per directory (`level="dir"`: tests/unit/api) or per file."""
        out: dict[str, float] = defaultdict(float)
        for nodeid, seconds in self.tests.items():
            path = nodeid.split("::", 1)[0]
            out[os.path.dirname(path) if level == "dir" else path] += seconds
        return dict(out)

    def lines(self, files: int = 15) -> list[str]:
        total = sum(self.tests.values())
        out = [f"test time {total:,.0f} s over {len(self.tests)} tests; by directory:"]
        for name, seconds in sorted(self.by("dir").items(), key=lambda kv: -kv[1]):
            out.append(f"  {seconds:8.1f} s  {100 * seconds / total if total else 0:5.1f} %  {name}")
        out.append(f"slowest {files} files:")
        for name, seconds in sorted(self.by("file").items(), key=lambda kv: -kv[1])[:files]:
            out.append(f"  {seconds:8.1f} s  {name}")
        return out

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"tests": dict(sorted(self.tests.items())), "dirs": self.by("dir"),
                                    "files": self.by("file")}, indent=1))


def report_path() -> Path:
    return Path(os.environ.get("SPARKPOINT_TEST_TIMES") or REPO / ".cache" / "test-times.json")
