"""The driver JVMs of a test run: the processes tests start compile with C1 only, the
in-process session keeps both compilers, and a PYSPARK_SUBMIT_ARGS set from outside is
left alone."""

from __future__ import annotations

import os

import pytest

from tests.servers import spark_cds

C1_ONLY = "-XX:TieredStopAtLevel=1"


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.setattr(spark_cds, "_children_args", None)
    monkeypatch.setattr(spark_cds, "_session_args", None)
    archive = tmp_path / "driver.jsa"
    monkeypatch.setattr(spark_cds, "archive_path", lambda: archive)
    return archive, monkeypatch


@pytest.mark.parametrize("archive_made", [True, False])
def test_children_get_c1_only_and_the_session_both_compilers(fresh, archive_made):
    archive, monkeypatch = fresh
    if archive_made:
        archive.write_bytes(b"cds")
    spark_cds.configure_test_jvms()

    children = os.environ["PYSPARK_SUBMIT_ARGS"]
    assert C1_ONLY in children and (str(archive) in children) == archive_made
    with spark_cds.session_jvm():
        session = os.environ.get("PYSPARK_SUBMIT_ARGS")
        assert session is None or C1_ONLY not in session
        assert (session is not None and str(archive) in session) == archive_made
    assert os.environ["PYSPARK_SUBMIT_ARGS"] == children


def test_submit_args_set_from_outside_are_left_alone(fresh):
    _, monkeypatch = fresh
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-memory 2g pyspark-shell")
    spark_cds.configure_test_jvms()
    with spark_cds.session_jvm():

        assert os.environ["PYSPARK_SUBMIT_ARGS"] == "--driver-memory 2g pyspark-shell"
    assert os.environ["PYSPARK_SUBMIT_ARGS"] == "--driver-memory 2g pyspark-shell"
