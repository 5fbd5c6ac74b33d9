"""The README's Python examples run as written: each ```python block is
saved as a pipeline file, loaded the way `sparkpoint run` loads it, and run, only
pointed at a temporary checkpoint and state directory. The first block runs with
`sparkpoint run` in a process of its own, as a user runs it; the others run in this
process on the shared session (the CLI around them is the same). A pipeline over an
endless source is stopped (SIGTERM; in-process the stop it asks for) once it has
committed output; every block must end FINISHED with committed output in its sink."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sparkpoint.connectors.parquet_sink import read_committed

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def readme_blocks() -> list[str]:
    return BLOCK.findall((REPO / "README.md").read_text())


def test_the_readme_has_python_examples() -> None:
    blocks = readme_blocks()
    assert len(blocks) >= 2
    assert any("ProcessorOperator(" in b and "time_mode=" in b for b in blocks)


def _block(tmp_path: Path, index: int) -> tuple[str, Path, str]:
    """The block's code, its pipeline file, and its sink's path (relative to the run's directory)."""
    code = readme_blocks()[index]
    sink = re.search(r'ParquetSink\("([^"]+)"\)', code)
    assert "pipeline = " in code and sink, f"README block {index} is not a runnable pipeline:\n{code}"
    file = tmp_path / f"readme_{index}.py"
    file.write_text(code)
    return code, file, sink.group(1)


def _committed_output_then_a_checkpoint(text: str) -> bool:
    produced = re.search(r"\| out [1-9]", text)
    return bool(produced and re.search(r"completed checkpoint \d+ of job", text[produced.end():]))


@pytest.mark.parametrize("index", range(1, len(readme_blocks())))
def test_readme_example_runs_in_process(spark, tmp_path: Path, monkeypatch, index: int) -> None:
    from sparkpoint.config import Settings
    from sparkpoint.ops.cli import _load_pipeline
    from sparkpoint.runtime.status import JobStatus
    from tests.inprocess import start

    code, file, sink = _block(tmp_path, index)
    monkeypatch.chdir(tmp_path)  # a relative sink path is the run's working directory's
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader puts the file's directory first
    pipeline = _load_pipeline(str(file))
    settings = Settings.load(None, [f"execution.checkpointing.dir={tmp_path / 'checkpoints'}",
                                    f"state.local.dir={tmp_path / 'state'}", "rest.enabled=false"],
                             base={"pipeline.name": pipeline.name} if pipeline.name else None)
    run = start(pipeline, settings, spark)
    try:
        if "total_events=" not in code:
            deadline = time.monotonic() + 240
            while not _committed_output_then_a_checkpoint(run.text):
                assert run.result is None and run.error is None, f"an endless job ended:\n{run.tail()}"
                assert time.monotonic() < deadline, f"no output committed in 240 s:\n{run.tail()}"
                time.sleep(0.5)
            run.job.stop(savepoint=False).result(120)  # what SIGTERM asks for
        result = run.wait(240)
    finally:
        if run.result is None and run.error is None:
            run.crash("the test failed")
    assert result.status is JobStatus.FINISHED, run.tail()
    assert "Traceback" not in run.text, run.tail()
    assert read_committed(str(tmp_path / sink)).num_rows > 0, run.tail()


@pytest.mark.e2e
def test_the_first_readme_example_runs_as_written_with_sparkpoint_run(tmp_path: Path) -> None:
    index = 0
    code, file, sink = _block(tmp_path, index)
    cmd = [sys.executable, "-m", "sparkpoint.ops.cli", "--log-level", "INFO", "run", str(file),
           "--set", f"execution.checkpointing.dir={tmp_path / 'checkpoints'}",
           "--set", f"state.local.dir={tmp_path / 'state'}", "--set", "rest.port=0"]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in proc.stdout), daemon=True)
    reader.start()
    try:
        # An endless source: stop it (with a last checkpoint) once a checkpoint after
        # the first output completed, so the output is there to check.
        # A bounded block ends by itself: signalling it would race with its exit.
        deadline = time.monotonic() + 240
        while "total_events=" not in code and proc.poll() is None and time.monotonic() < deadline:
            if _committed_output_then_a_checkpoint("\n".join(lines)):
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.5)
        rc = proc.wait(240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        reader.join(10)
    text = "\n".join(lines)
    assert rc == 0, text[-4000:]
    assert re.search(r"^job \S+ FINISHED", text, re.M), text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    output = read_committed(str(tmp_path / sink))
    assert output.num_rows > 0, text[-4000:]
