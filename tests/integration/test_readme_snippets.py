"""The README's Python examples run as written: each ```python block is
saved as a pipeline file and run with `sparkpoint run`, only pointed at a temporary
checkpoint and state directory. A pipeline over an endless source is stopped with
SIGTERM once it has committed output; every block must end FINISHED with committed
output in its sink."""

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

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def readme_blocks() -> list[str]:
    return BLOCK.findall((REPO / "README.md").read_text())


def test_the_readme_has_python_examples() -> None:
    blocks = readme_blocks()
    assert len(blocks) >= 2
    assert any("ProcessorOperator(" in b and "time_mode=" in b for b in blocks)


@pytest.mark.parametrize("index", range(len(readme_blocks())))
def test_readme_example_runs_as_written(tmp_path: Path, index: int) -> None:
    code = readme_blocks()[index]
    sink = re.search(r'ParquetSink\("([^"]+)"\)', code)
    assert "pipeline = " in code and sink, f"README block {index} is not a runnable pipeline:\n{code}"
    file = tmp_path / f"readme_{index}.py"
    file.write_text(code)
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
            text = "\n".join(lines)
            produced = re.search(r"\| out [1-9]", text)
            if produced and re.search(r"completed checkpoint \d+ of job", text[produced.end():]):
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
    output = read_committed(str(tmp_path / sink.group(1)))
    assert output.num_rows > 0, text[-4000:]
