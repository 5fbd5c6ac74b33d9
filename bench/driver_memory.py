"""Does output funnel through the driver? A stateless pass-through (GeneratorSource ->
ParquetSink) of N rows, run as a real `sparkpoint run` subprocess; reports the
driver's peak RSS (the Python driver process; the JVM is measured separately since
on local[*] it also hosts the executors) for several N. If output passed through
the driver, its peak would grow with N.

    python bench/driver_memory.py [--rows 1000000,10000000] [--work /tmp/sparkpoint-drivermem]

Prints one `RESULT {json}` line per size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PIPELINE = """
from sparkpoint import GeneratorSource, ParquetSink, Pipeline
pipeline = (Pipeline("passthrough")
            .source(GeneratorSource("events", keys=100_000, total_events={rows}, max_records_per_epoch=1_000_000))
            .sink(ParquetSink(r"{out}")))
"""

# Peak RSS of the driver: the Python process, read at exit by a tiny wrapper.
WRAPPER = """
import resource, runpy, sys
sys.argv = ["sparkpoint"] + sys.argv[1:]
try:
    runpy.run_module("sparkpoint.ops.cli", run_name="__main__")
finally:
    print("DRIVER_PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
"""


def run(rows: int, work: Path) -> dict:
    root = work / f"rows-{rows}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "p.py").write_text(PIPELINE.format(rows=rows, out=root / "out"))
    (root / "wrapper.py").write_text(WRAPPER)
    cmd = [sys.executable, str(root / "wrapper.py"), "run", str(root / "p.py"),
           "--set", f"execution.checkpointing.dir={root / 'chk'}", "--set", f"state.local.dir={root / 'state'}",
           "--set", "execution.checkpointing.interval=2 s", "--set", "sparkpoint.progress=false"]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
    peak_kb = int(proc.stdout.split("DRIVER_PEAK_RSS_KB")[-1].split()[0])
    import pyarrow.dataset as ds

    committed = ds.dataset(str(root / "out"), format="parquet", partitioning="hive",
                           exclude_invalid_files=True).count_rows()
    return {"rows": rows, "committed_rows": committed, "driver_peak_rss_mb": round(peak_kb / 1024, 1),
            "seconds": round(elapsed, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1000000,10000000")
    ap.add_argument("--work", default="/tmp/sparkpoint-drivermem")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for n in (int(x) for x in args.rows.split(",")):
        result = run(n, work)
        result.update({"machine": f"{os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d %H:%M")})
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
