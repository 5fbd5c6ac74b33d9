"""The servers a test run shares: one Kafka broker and one S3 API server, each started
by the first test that asks for it and stopped when the run ends (a broker JVM or a moto
process per module cost seconds each). Tests stay apart by name: each takes fresh
topics, groups and buckets from `tests.servers.names.unique_name`, never a fixed name."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.servers.kafka_broker import KafkaBroker
from tests.servers.names import unique_name
from tests.servers.s3_server import S3Server
from tests.servers.spark_cds import configure_test_jvms
from tests.time_report import TimeReport, report_path

# Every Spark driver JVM of the run (in-process, and in the processes tests start) maps its
# classes from the run's class-data archive when `make test` made one, and compiles with
# C1 only (tests/servers/spark_cds.py says why).
configure_test_jvms()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """The run's Kafka broker. A test that stops or restarts it asks for
    `kafka_broker_to_restart` instead."""
    with KafkaBroker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture
def kafka_broker_to_restart(kafka_broker: KafkaBroker) -> Iterator[KafkaBroker]:
    """The run's broker, for a test that stops or restarts it: running again afterwards,
    whatever the test did, for the tests that follow."""
    yield kafka_broker
    kafka_broker.start()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """The run's S3 API server (storage options: `s3_server.storage_options()`)."""
    with S3Server() as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server: S3Server, request: pytest.FixtureRequest) -> str:
    """A new, empty bucket on the run's S3 server, named after the test."""
    return s3_server.create_bucket(unique_name(request.node.name))


# -- tiers and workers --------------------------------------------------------------------
# What a test needs is marked from the fixtures it uses, so a tier chosen by marker
# (`make test-fast`: no JVM) never starts one through a test nobody marked. That tier
# runs on four pytest-xdist workers (its tests wait on servers and sleeps as much as they
# compute). `make test` runs the JVM tests in three processes side by side (the Makefile's
# JVM_SESSION, JVM_KAFKA_S3 and JVM_JOBS): the in-process tests on a session of their own,
# the tests of the Kafka broker and the S3 server, and the tests that start the cluster or
# other job processes, so the run's one broker and one cluster stay one. pytest-xdist does
# not split them: its workers would each start the servers.
_NEEDS = (("spark", "spark"), ("kafka_broker", "kafka"), ("s3_server", "s3"), ("cluster", "cluster"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        for fixture, marker in _NEEDS:
            if fixture in names and item.get_closest_marker(marker) is None:
                item.add_marker(getattr(pytest.mark, marker))
        if "tests/e2e/" in item.nodeid and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)
        if "tests/cluster/" in item.nodeid and item.get_closest_marker("cluster") is None:
            item.add_marker(pytest.mark.cluster)


# -- where the run's time goes (tests/time_report.py) ------------------------------------
_TIMES = TimeReport()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _TIMES.add(report.nodeid, report.duration)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller reports every test
        return
    if not _TIMES.tests or len(_TIMES.tests) < 50:  # a single file or -k run: its own output says enough
        return
    for line in _TIMES.lines():
        terminalreporter.write_line(line)
    try:
        _TIMES.write(report_path())
    except OSError as e:  # a read-only checkout: the printed summary is what counts
        terminalreporter.write_line(f"(test times not written: {e})")
