"""The Nexmark tests run on the shared in-process SparkSession of the integration tests."""

from tests.integration.conftest import spark  # noqa: F401 - the fixture, shared by name
