"""The run's time report adds each test's phases and sums them per directory and file."""

from __future__ import annotations

import json

from tests.time_report import TimeReport


def test_phases_add_up_per_test_directory_and_file(tmp_path):
    report = TimeReport()
    for nodeid, seconds in [("tests/e2e/test_kill.py::test_a", 1.5), ("tests/e2e/test_kill.py::test_a", 30.0),
                            ("tests/e2e/test_kill.py::test_b", 2.0), ("tests/unit/api/test_x.py::test_c", 0.5)]:
        report.add(nodeid, seconds)
    assert report.tests["tests/e2e/test_kill.py::test_a"] == 31.5
    assert report.by("dir") == {"tests/e2e": 33.5, "tests/unit/api": 0.5}
    assert report.by("file") == {"tests/e2e/test_kill.py": 33.5, "tests/unit/api/test_x.py": 0.5}
    lines = report.lines(files=1)
    assert lines[0] == "test time 34 s over 3 tests; by directory:"
    assert lines[1].split() == ["33.5", "s", "98.5", "%", "tests/e2e"]
    assert lines[-1].split() == ["33.5", "s", "tests/e2e/test_kill.py"]
    report.write(tmp_path / "times.json")
    assert json.loads((tmp_path / "times.json").read_text())["dirs"]["tests/e2e"] == 33.5
