"""The driver JVMs of a test run, the in-process session's and the processes' the tests
start, compile with C1 only and map the class-data archive when it was made; a
PYSPARK_SUBMIT_ARGS set from outside is left alone."""

from __future__ import annotations

import os

import pytest

from tests.servers import spark_cds

C1_ONLY = "-XX:TieredStopAtLevel=1"


@pytest.fixture
def archive(monkeypatch, tmp_path):
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    path = tmp_path / "driver.jsa"
    monkeypatch.setattr(spark_cds, "archive_path", lambda: path)
    return path


@pytest.mark.parametrize("archive_made", [True, False])
def test_every_driver_jvm_gets_c1_only_and_the_archive_if_made(archive, archive_made):
    if archive_made:
        archive.write_bytes(b"cds")
    spark_cds.configure_test_jvms()

    args = os.environ["PYSPARK_SUBMIT_ARGS"]
    assert C1_ONLY in args and args.endswith("pyspark-shell")
    assert (f"-XX:SharedArchiveFile={archive}" in args) == archive_made


def test_submit_args_set_from_outside_are_left_alone(archive, monkeypatch):
    archive.write_bytes(b"cds")
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-memory 2g pyspark-shell")
    spark_cds.configure_test_jvms()
    assert os.environ["PYSPARK_SUBMIT_ARGS"] == "--driver-memory 2g pyspark-shell"
