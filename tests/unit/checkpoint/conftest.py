from __future__ import annotations

import pytest
from checkpoint_support import Harness, make_harness


@pytest.fixture
def h() -> Harness:
    return make_harness()
