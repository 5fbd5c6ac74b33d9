"""The PySpark sparkpoint runs on: the `spark` extra's, or the one a cluster provides.

sparkpoint does not pin PySpark (a platform's own Spark must not be replaced), so the
range is checked once, when sparkpoint is imported, and a miss is one line that says
what was found and what to do. The check reads the version of the pyspark that
`import pyspark` would load, without importing it: importing sparkpoint stays cheap, and
a pyspark on PYTHONPATH (Databricks, a Spark image) is judged rather than some other
installed distribution's metadata."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from sparkpoint.errors import UnsupportedPySpark

SUPPORTED = (4, 5)  # major versions: >= 4.0, < 5
SUPPORTED_TEXT = "pyspark>=4.0,<5"

_VERSION_ASSIGNMENT = re.compile(r"""^__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""", re.MULTILINE)


def installed_pyspark_version() -> str | None:
    """The version of the pyspark `import pyspark` loads, or None when there is none."""
    loaded = sys.modules.get("pyspark")
    if loaded is not None and getattr(loaded, "__version__", None):
        return str(loaded.__version__)
    spec = importlib.util.find_spec("pyspark")
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():
        version_file = Path(location) / "version.py"
        if version_file.is_file():
            found = _VERSION_ASSIGNMENT.search(version_file.read_text(encoding="utf-8", errors="replace"))
            if found:
                return found.group(1)
    from pyspark.version import __version__  # a layout this reader does not know

    return str(__version__)


def problem(version: str | None) -> str | None:
    """The one line that says why this PySpark cannot run sparkpoint, or None when it can."""
    fix = "pip install 'sparkpoint[spark]', or run on a Spark 4 runtime (its pyspark is used as it is)"
    if version is None:
        return f"sparkpoint needs PySpark ({SUPPORTED_TEXT}) and none is importable: {fix}"
    major = re.match(r"(\d+)\.", version)
    if major is None or not SUPPORTED[0] <= int(major.group(1)) < SUPPORTED[1]:
        return f"sparkpoint needs {SUPPORTED_TEXT} but found pyspark {version}: {fix}"
    return None


def require_supported_pyspark() -> None:
    """Raise UnsupportedPySpark (one line) unless a supported PySpark is importable."""
    line = problem(installed_pyspark_version())
    if line is not None:
        raise UnsupportedPySpark(line)
