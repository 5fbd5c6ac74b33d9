"""The house stays legible: the import contracts in pyproject.toml hold, and nothing in
production code unpickles (DESIGN.md section 3)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sparkpoint"
PICKLE_MODULES = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill"}
UNPICKLING = {"load", "loads", "Unpickler"}


def test_import_contracts_hold() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"lint-imports found broken contracts:\n{done.stdout}\n{done.stderr}"


def _unpickling_calls(source: str) -> list[int]:
    """Line numbers where `source` unpickles: pickle.loads(...), cloudpickle.load(...),
    pickle.Unpickler(...), under any alias, or `from pickle import loads`."""
    tree = ast.parse(source)
    aliases: set[str] = set()
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name.split(".")[-1] in PICKLE_MODULES}
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[-1] in PICKLE_MODULES and any(a.name in UNPICKLING for a in node.names):
                lines.append(node.lineno)
            aliases |= {a.asname or a.name for a in node.names if a.name in PICKLE_MODULES}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in UNPICKLING
                and isinstance(node.func.value, ast.Name) and node.func.value.id in aliases):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_unpickling_check_sees_aliases() -> None:
    assert _unpickling_calls("import pickle\npickle.loads(b'')") == [2]
    assert _unpickling_calls("from pyspark import cloudpickle as cp\ncp.load(f)") == [2]
    assert _unpickling_calls("from pickle import loads") == [1]
    assert _unpickling_calls("import pickle\npickle.dumps(x)\n'pickle.loads(b)'") == []


def test_no_production_module_unpickles() -> None:
    """Nothing read from checkpoint storage is ever unpickled; the cheapest way to keep
    that true is that production code never unpickles at all (Spark's own shipping of
    closures is Spark's business, not ours)."""
    found = [f"{path.relative_to(REPO)}:{line}"
             for path in sorted(PACKAGE.rglob("*.py")) if "testing" not in path.relative_to(PACKAGE).parts
             for line in _unpickling_calls(path.read_text())]
    assert found == [], f"production code unpickles at: {found}"
