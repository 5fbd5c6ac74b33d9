"""`sparkpoint run --allow-non-restored-state` is Flink's flag for dropping the state of
steps the pipeline no longer has: it sets execution.savepoint.ignore-unclaimed-state."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import sparkpoint.runtime.jobmaster as jobmaster_module
from sparkpoint.errors import ConfigError
from sparkpoint.ops.cli import cli

PIPELINE = """
from sparkpoint import GeneratorSource, KeyedAggregate, ParquetSink, Pipeline
pipeline = (Pipeline("flag").source(GeneratorSource("g", total_events=10))
            .stateful(KeyedAggregate("totals", ["key"], "value")).sink(ParquetSink("out")))
"""


@pytest.mark.parametrize("args, ignored", [([], False), (["--allow-non-restored-state"], True)])
def test_the_flag_sets_ignore_unclaimed_state(tmp_path, monkeypatch, args, ignored):
    (tmp_path / "p.py").write_text(PIPELINE)
    seen = []

    class Recording:
        def __init__(self, pipeline, settings, spark=None):
            seen.append(settings.ignore_unclaimed_state)
            raise ConfigError("stop here")

    monkeypatch.setattr(jobmaster_module, "JobMaster", Recording)
    result = CliRunner().invoke(cli, ["run", str(tmp_path / "p.py"), *args])
    assert seen == [ignored], result.output
    assert "stop here" in result.output
