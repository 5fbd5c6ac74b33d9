"""`sparkpoint chaos examples/demo.py` passes.

A short variant: the demo reads DEMO_EVENTS (fewer events), `--set` checkpoints every
second, one SIGKILL in the kill9 scenario (the storms of test_chaos_storm.py and
test_chaos.py kill more often). The command runs as a real subprocess; it
starts the real `sparkpoint run` processes itself and compares their committed output
with its own fault-free run's (that reference run is the command's feature under test).
"""

from __future__ import annotations

import json
from collections import Counter
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkpoint.ops.chaos import Chaos, compare

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# The command on the demo runs the two faults that restart it: a SIGKILL, and a corrupt
# newest checkpoint the restart falls back past. The storage outage and the second
# deployment run on a windowed job in test_chaos.py and on Delta and Kafka in the storms
# of test_chaos_storm.py, through the same fault code; each costs a demo run here.
SHORT = ["--set", "execution.checkpointing.interval=1s", "--kills", "1", "--parallel", "2",
         "--faults", "kill9,corrupt"]


def _chaos(tmp_path: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, DEMO_EVENTS="100000", PYSPARK_PYTHON=sys.executable)
    return subprocess.run([sys.executable, "-m", "sparkpoint.ops.cli", "chaos", "examples/demo.py", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_chaos_on_the_demo_passes_a_kill_and_a_corrupt_newest_checkpoint(tmp_path: Path) -> None:
    work = tmp_path / "work"
    proc = _chaos(tmp_path, *SHORT, "--seed", "11", "--workdir", str(work), "--json")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert report["ok"] and report["reference"]["rows"] > 0
    verdicts = {v["fault"]: v for v in report["faults"]}
    assert list(verdicts) == ["kill9", "corrupt"]
    for fault, v in verdicts.items():
        assert v["passed"] and v["lost"] == 0 and v["duplicated"] == 0 and v["unexpected"] == 0, (fault, v)
        assert v["committed"] == report["reference"]["rows"], (fault, v)
    assert verdicts["kill9"]["restarts"] >= 1
    assert verdicts["corrupt"]["restarts"] >= 1
    # Every run left its log in the work directory.
    assert (work / "reference" / "run.log").exists() and list((work / "corrupt").glob("*.log"))


def test_chaos_refuses_a_sink_path_it_cannot_redirect(tmp_path: Path) -> None:
    pipeline = tmp_path / "absolute.py"
    pipeline.write_text(
        "from sparkpoint import GeneratorSource, ParquetSink, Pipeline\n"
        "pipeline = Pipeline('abs').source(GeneratorSource(total_events=10))"
        f".sink(ParquetSink({str(tmp_path / 'out')!r}))\n")
    proc = subprocess.run([sys.executable, "-m", "sparkpoint.ops.cli", "chaos", str(pipeline),
                           "--workdir", str(tmp_path / "work")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "which every run would share" in proc.stderr and "SPARKPOINT_CHAOS_RUN_DIR" in proc.stderr
    assert not (tmp_path / "work" / "reference").exists()


def test_compare_counts_lost_duplicated_and_unexpected_rows_as_multisets() -> None:
    expected = Counter({(1, "a"): 1, (2, "b"): 2, (3, "c"): 1})
    assert compare(expected, Counter(expected))["lost"] == 0
    got = Counter({(1, "a"): 2, (2, "b"): 1, (9, "z"): 1})  # one twice, one of two missing, one gone, one new
    assert compare(expected, got) == {"expected": 4, "committed": 4, "lost": 2, "duplicated": 1, "unexpected": 1}


def test_chaos_runs_use_their_own_consumer_group_dead_letter_dir_output_topic_and_transactional_ids(
        tmp_path: Path) -> None:
    """A run must not share anything with production: not the consumer group of a
    KafkaSource (a run would commit its offsets into production's group), not a
    FileSource's dead-letter directory, not a KafkaSink's topic or transactional ids
    (a run would write into production's topic and fence its producer)."""
    from sparkpoint.connectors.files import FileSource
    from sparkpoint.connectors.kafka_sink import KafkaSink
    from sparkpoint.connectors.kafka_source import KafkaSource
    from sparkpoint.ops.chaos import Output
    from sparkpoint.ops.cli import _load_pipeline

    kafka = tmp_path / "kafka_pipeline.py"
    kafka.write_text(
        "from sparkpoint import Pipeline\n"
        "from sparkpoint.connectors.kafka_sink import KafkaSink\n"
        "from sparkpoint.connectors.kafka_source import KafkaSource\n"
        "pipeline = Pipeline('orders').source(KafkaSource('127.0.0.1:1', 'orders', group_id='production', "
        "bounded=True)).sink(KafkaSink('127.0.0.1:1', 'totals'))\n")
    files = tmp_path / "files_pipeline.py"
    files.write_text(
        "from sparkpoint import FileSource, ParquetSink, Pipeline\n"
        f"pipeline = Pipeline('files').source(FileSource({str(tmp_path / 'in')!r}, schema='a string', "
        f"mode='PERMISSIVE', dead_letter={str(tmp_path / 'production-dead-letters')!r}))"
        ".sink(ParquetSink('out'))\n")
    seen = {}
    for name, path in (("kafka", kafka), ("files", files)):
        chaos = Chaos(str(path), None, (), ["kill9"], 1, tmp_path / f"work-{name}", 60, None)
        chaos.output = Output("parquet", "out")
        for run in ("reference", "kill9"):
            rundir = tmp_path / f"work-{name}" / run
            # What `sparkpoint run` loads in that run.
            seen[name, run] = _load_pipeline(str(chaos.run_pipeline(rundir)))
    production = _load_pipeline(str(kafka))
    groups = {seen["kafka", run].source_.group_id for run in ("reference", "kill9")}
    topics = {seen["kafka", run].sink_.topic for run in ("reference", "kill9")}
    txn_ids = {seen["kafka", run].sink_.transactional_id_prefix for run in ("reference", "kill9")}
    assert isinstance(production.source_, KafkaSource) and isinstance(production.sink_, KafkaSink)
    assert len(groups) == len(topics) == len(txn_ids) == 2
    assert production.source_.group_id not in groups and all(g.startswith("production.chaos-") for g in groups)
    assert production.sink_.topic not in topics and all(t.startswith("totals.chaos-") for t in topics)
    assert production.sink_.transactional_id_prefix not in txn_ids
    for run in ("reference", "kill9"):
        source = seen["files", run].source_
        assert isinstance(source, FileSource)
        assert source.dead_letter == str(tmp_path / "work-files" / run / "dead-letter" / source.name)
