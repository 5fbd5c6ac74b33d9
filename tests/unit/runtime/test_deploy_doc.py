"""docs/deploy.md states what sparkpoint sets in a Spark session it creates and how keys
map to environment variables: both tables say what the code does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkpoint.config import Settings
from sparkpoint.runtime.spark import own_settings

DOC = (Path(__file__).resolve().parents[3] / "docs" / "deploy.md").read_text()


def _section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, re.S | re.M)
    assert m, f"docs/deploy.md has no section {title!r}"
    return m.group(1)


def _rows(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"^\s*\| `([^`]+)` \| `?([^|`]+)`? \|", text, re.M)}


@pytest.mark.parametrize("master", ["local[2]", "spark://m:7077"])
def test_the_deploy_doc_lists_every_spark_setting_sparkpoint_makes(master):
    documented = _rows(_section("What sparkpoint sets in Spark"))
    parallelism = 3
    for setting in own_settings(master, parallelism):
        shown = documented.get(setting.key)
        assert shown is not None, f"{setting.key} is not in docs/deploy.md"
        assert shown == (setting.value if setting.value != str(parallelism) else "parallelism.default"), setting.key


def test_the_deploy_docs_environment_variables_are_the_keys():
    table = _rows(_section("Configuration"))
    assert table
    for key, variable in table.items():
        assert key in Settings.keys(), key
        assert variable.split("=")[0].split(" ")[0] == Settings.env_name(key)


def test_the_readmes_cluster_command_is_the_one_the_cluster_test_runs():
    """README's "Run it on a cluster" command is docs/deploy.md's spark-submit block, which
    tests/cluster runs as written against a standalone cluster."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = re.search(r"^## Run it on a cluster\n(.*?)(?=^## )", readme, re.S | re.M).group(1)
    block = re.search(r"^```bash\n(.*?)^```", section, re.S | re.M).group(1)
    tested = re.search(r"^<!-- deploy-test: spark-submit -->\n```bash\n(.*?)^```", DOC, re.S | re.M).group(1)
    assert block == tested


def test_the_deploy_docs_yaml_example_loads_as_it_says(tmp_path):
    """Numbers and booleans under spark.conf, as the docs show them, become Spark's strings."""
    text = re.search(r"^\s*```yaml\n(.*?)^\s*```", _section("Configuration"), re.S | re.M).group(1)
    f = tmp_path / "job.yaml"
    f.write_text(text)
    s = Settings.load(f, environ={})
    assert s.spark_master == "yarn"
    assert s.spark_conf == {"spark.executor.instances": "4", "spark.executor.memory": "4g",
                            "spark.dynamicAllocation.enabled": "false"}
