"""The docs' front page is where a new user starts: its quickstart pipeline must be one
the README snippet test runs as written (tests/integration/test_readme_snippets.py), and
the page is the site's home."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def test_the_quickstart_pipeline_is_a_readme_example_that_runs_as_written():
    (quickstart,) = BLOCK.findall((REPO / "docs" / "index.md").read_text())
    assert quickstart in BLOCK.findall((REPO / "README.md").read_text())


def test_the_index_page_is_the_first_in_the_nav():
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    assert nav[0] == {"Home": "index.md"}
