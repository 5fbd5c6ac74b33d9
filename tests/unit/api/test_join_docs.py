"""docs/joins.md's examples hold: the harness example runs as written and passes, and
every join the other examples build is a valid step."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import sparkpoint

DOC = Path(__file__).resolve().parents[3] / "docs" / "joins.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), re.S | re.M)


def test_the_harness_example_on_the_joins_page_passes() -> None:
    (example,) = [b for b in BLOCKS if "ProcessorTester" in b]
    namespace: dict = {"__name__": "joins_doc"}
    exec(compile(example, str(DOC), "exec"), namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_") and callable(fn)]
    assert tests, "the example defines no test function"
    for test in tests:
        test()
    assert "snapshot()" in example and "from_snapshot(" in example


def test_every_join_the_pipeline_examples_build_is_a_valid_step() -> None:
    built = 0
    for block in BLOCKS:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("IntervalJoin", "WindowJoin",
                                                                                 "StreamJoin"):
                eval(compile(ast.Expression(node), str(DOC), "eval"), vars(sparkpoint))  # raises on a bad argument
                built += 1
    assert built >= 4
