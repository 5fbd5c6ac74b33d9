from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The helpers sit next to this file; make them importable under any pytest import mode.
sys.path.insert(0, str(Path(__file__).parent))

from snapshot_support import Remote  # noqa: E402


@pytest.fixture
def remote(tmp_path: Path) -> Remote:
    return Remote.at(tmp_path / "remote")
