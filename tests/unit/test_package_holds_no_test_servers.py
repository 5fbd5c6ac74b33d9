"""The installed package carries what users call and nothing of the project's own test
setup: `sparkpoint.testing` is the user's test harness only, and no module of the
package imports a test server, the test tree or a test-only dependency (moto, boto3),
so the wheel needs neither a checkout's `.cache/` nor the test extra."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "sparkpoint"
TEST_ONLY = ("tests", "moto", "boto3", "pytest")
USER_HARNESS = {"__init__.py", "harness.py", "harness_keys.py"}


def _imported_modules(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_sparkpoint_testing_is_the_user_harness_only() -> None:
    assert {p.name for p in (PACKAGE / "testing").glob("*.py")} == USER_HARNESS


def test_no_package_module_imports_test_servers_or_test_only_dependencies() -> None:
    found = sorted(f"{path.relative_to(REPO)}: {module}"
                   for path in PACKAGE.rglob("*.py")
                   for module in _imported_modules(path.read_text())
                   if module.split(".")[0] in TEST_ONLY)
    assert found == [], f"the package imports test-only modules: {found}"
