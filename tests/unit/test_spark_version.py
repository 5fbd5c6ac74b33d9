"""sparkpoint runs on the PySpark it finds (the `spark` extra's or a cluster's), so a
missing or unsupported one must stop `import sparkpoint` with one line that says what
was found and what to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparkpoint.spark_version import installed_pyspark_version, problem

REPO = Path(__file__).resolve().parents[2]


def _import_sparkpoint(*python_flags: str, first_on_path: Path | None = None) -> subprocess.CompletedProcess:
    path = [str(first_on_path)] if first_on_path else []
    env = {"PYTHONPATH": ":".join(path + [str(REPO)]), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, *python_flags, "-c", "import sparkpoint"], env=env,
                          capture_output=True, text=True, timeout=120)


def _fake_pyspark(root: Path, version_line: str) -> Path:
    (root / "pyspark").mkdir(parents=True)
    (root / "pyspark" / "__init__.py").write_text("raise SystemExit('the version check must not import pyspark')\n")
    (root / "pyspark" / "version.py").write_text(version_line + "\n")
    return root


def test_an_old_pyspark_stops_the_import_with_one_line_naming_it(tmp_path):
    done = _import_sparkpoint(first_on_path=_fake_pyspark(tmp_path, "__version__: str = '3.5.1'"))
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("sparkpoint.errors.UnsupportedPySpark: sparkpoint needs pyspark>=4.0,<5 but found pyspark 3.5.1: "
                    "pip install 'sparkpoint[spark]', or run on a Spark 4 runtime (its pyspark is used as it is)")


def test_no_pyspark_stops_the_import_with_one_line_saying_how_to_get_it():
    # -S: no site-packages, so no pyspark; the check runs before anything else needs them
    done = _import_sparkpoint("-S")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("sparkpoint.errors.UnsupportedPySpark: sparkpoint needs PySpark (pyspark>=4.0,<5) and none is "
                    "importable: pip install 'sparkpoint[spark]', or run on a Spark 4 runtime (its pyspark is used as it is)")


def test_the_pyspark_on_the_path_is_judged_without_importing_it(tmp_path):
    # A cluster's pyspark earlier on PYTHONPATH wins over an installed distribution; a
    # supported one passes, and its __init__ (which would exit) never runs.
    done = _import_sparkpoint(first_on_path=_fake_pyspark(tmp_path, '__version__ = "4.0.0"'))
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("version, supported", [
    ("4.0.0", True), ("4.1.1", True), ("4.3.0", True), ("4.0.0.dev1", True),
    ("3.5.7", False), ("5.0.0", False), ("nonsense", False),
])
def test_the_supported_range_is_pyspark_4(version, supported):
    assert (problem(version) is None) is supported


def test_the_running_pyspark_is_the_one_reported():
    import pyspark

    assert installed_pyspark_version() == pyspark.__version__
