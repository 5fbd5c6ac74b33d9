"""docs/testing.md's example runs as written: its Python block is executed and every
test function in it must pass."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "testing.md"


def test_the_testing_page_example_passes() -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)
    assert blocks, "docs/testing.md has no Python example"
    namespace: dict = {"__name__": "testing_doc"}
    exec(compile("\n".join(blocks), str(DOC), "exec"), namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_") and callable(fn)]
    assert tests, "the example defines no test function"
    for test in tests:
        test()
    assert "snapshot()" in blocks[0] and "from_snapshot(" in blocks[0]  # the restore in the middle
