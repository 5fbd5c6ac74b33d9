"""The docs site builds without a warning (`mkdocs build --strict`: every page in the
nav, every `::: sparkpoint...` reference resolves, links hold), and the configuration
page is generated from sparkpoint/config.py as it is now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_config_keys_page_is_up_to_date() -> None:
    done = subprocess.run([sys.executable, "scripts/gen_config_keys.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_config_key_is_on_the_page_with_a_unit_and_a_description() -> None:
    from sparkpoint.config import Settings

    page = (REPO / "docs" / "config-keys.md").read_text()
    for key in Settings.keys():
        row = next((line for line in page.splitlines() if line.startswith(f"| `{key}` |")), None)
        assert row is not None, key
        assert row.split("|")[3].strip(), f"{key} has no unit or type"
        assert row.split("|")[4].strip(), f"{key} is not described: a comment above its field in config.py"
    assert "| `execution.checkpointing.timeout` | `1 min` | duration (bare number: ms) |" in page


def test_docs_site_builds_strictly_with_the_api_reference(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    for name in ("Pipeline", "ProcessorOperator", "StatefulProcessor", "ParquetSink", "SparkpointError"):
        assert name in reference, name
    assert (tmp_path / "site" / "common-mistakes" / "index.html").exists()
