"""Wall time of each Nexmark example (examples/nexmark/qN.py) on N generated events, run
as a user runs it: `NEXMARK_INPUT=DIR sparkpoint run examples/nexmark/qN.py`, one at a
time, Spark start included. The machine's load average (`os.getloadavg`) is recorded
before and after each run, since a busy machine changes every figure.

    python bench/nexmark_timings.py [--events 1000000] [--queries q0,q1,...]
                                    [--files-per-stream 20] [--files-per-epoch 2]
                                    [--workdir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUERIES = ["q0", "q1", "q2", "q3", "q4", "q7", "q8", "q9", "q10", "q13", "q14", "q18", "q19", "q20", "q21"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--files-per-stream", type=int, default=20)
    parser.add_argument("--files-per-epoch", type=int, default=2)
    parser.add_argument("--queries", default=",".join(QUERIES))
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="nexmark-timings-")).resolve()
    input_dir = workdir / "input"
    cli = [sys.executable, "-m", "sparkpoint.ops.cli"]
    if not (input_dir / "bid").is_dir():
        subprocess.run([*cli, "nexmark", "generate", "--events", str(args.events), "--out", str(input_dir),
                        "--files-per-stream", str(args.files_per_stream)], check=True)
    for query in [q.strip() for q in args.queries.split(",") if q.strip()]:
        run = workdir / query
        shutil.rmtree(run, ignore_errors=True)  # else the run restores a finished job and reads nothing
        env = dict(os.environ, NEXMARK_INPUT=str(input_dir), NEXMARK_OUTPUT=str(run / "out"),
                   NEXMARK_FILES_PER_EPOCH=str(args.files_per_epoch))
        env.pop("NEXMARK_SIDE_INPUT", None)
        load_before = os.getloadavg()[0]
        began = time.monotonic()
        done = subprocess.run([*cli, "run", str(REPO / "examples" / "nexmark" / f"{query}.py"),
                               "--set", f"execution.checkpointing.dir={run / 'checkpoints'}",
                               "--set", f"state.local.dir={run / 'state'}", "--set", "rest.port=0",
                               "--set", "sparkpoint.progress=false"],
                              env=env, cwd=run.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seconds = time.monotonic() - began
        (workdir / f"{query}.log").write_text(done.stdout)
        summary = next((line for line in reversed(done.stdout.splitlines()) if line.startswith("job ")), "")
        result = {"query": query, "events": args.events, "seconds": round(seconds, 1), "exit_code": done.returncode,
                  "load_before": round(load_before, 1), "load_after": round(os.getloadavg()[0], 1),
                  "summary": summary}
        print(json.dumps(result), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
