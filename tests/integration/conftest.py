"""One local SparkSession for every in-process integration test (starting one costs
~20 s on this machine; the runtime never stops a session it was handed)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from sparkpoint.runtime.spark import get_or_create_spark

    return get_or_create_spark("local[2]", "tests", 2)


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test():
    """A test that failed half-way through an in-process run (tests/inprocess.py) must
    not leave it running on the shared session into the next test."""
    yield
    import sys

    inprocess = sys.modules.get("tests.inprocess")
    if inprocess is not None:
        inprocess.crash_leftovers()
