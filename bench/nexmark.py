"""Nexmark on sparkpoint, Spark Structured Streaming and PyFlink, one query at a time, over
the same generated Parquet input; per query events/s, checkpoint p50/p99, peak memory and
CPU-seconds per million events, then the geometric mean of the ratios sparkpoint / peer.

    python bench/nexmark.py [--events 10000000] [--queries q0,q1,...] [--systems sparkpoint,spark-ss,pyflink]
        [--files-per-stream 20] [--files-per-epoch 2] [--work /tmp/sparkpoint-bench] [--json FILE]
    python bench/run_all.py --only nexmark      # the same, recorded in bench/runs.jsonl and bench/RESULTS.md

Input: `sparkpoint nexmark generate --events N --files-per-stream F` once per (N, F) under
<work>/nexmark-<N>-<F>/ (person/, auction/, bid/, event-time order in file-name order).
Every system reads F-files-per-epoch files of each stream per epoch / batch, parallelism 2,
checkpoints every 1 s, watermark `dateTime - 4 s`.

- sparkpoint: `NEXMARK_INPUT=DIR sparkpoint run examples/nexmark/qN.py` in a child process, as a
  user runs it (one JVM start per query), output through the example's exactly-once ParquetSink.
  Measured from the job's REST API (rest.port=0, the port read from its start-up line), polled every
  0.1 s: `records-in` over time and the checkpoint history (`end_to_end_duration` of completed ones).
- Spark SS: bench/nexmark_spark_ss.py (one process, one session, the queries one after the other).
- PyFlink: bench/pyflink/nexmark_flink.py in bench/.venv-pyflink (nexmark-flink's SQL).

events/s after start-up (all systems exclude JVM start and planning): sparkpoint: records read after
the first poll that saw records, over the time from that poll to the first poll that saw the most
(the process may end before a poll sees the last epoch's; the final checkpoint is excluded); Spark SS: the same on its batch progress
(events after batch 0 over end of batch 0 to end of the last batch with data); PyFlink: events /
(job FINISHED - last subtask RUNNING), from its JobManager log (includes its final checkpoint).
Checkpoint p50/p99: sparkpoint's completed checkpoints triggered after that first poll (all of
them in `ckpt_p99_ms_incl_startup`); PyFlink's `end_to_end_duration` (Flink triggers none before its
tasks run); Spark SS commits its state in every batch (batch duration p50/p99 in the RESULT).
CPU-s per M events: CPU (user + system) of the system's whole process tree (driver, JVM, Python
workers) over the same span as events/s for sparkpoint and Spark SS; over the job from submission
to FINISHED for PyFlink. Peak memory: summed PSS (sparkpoint, Spark SS) / RSS (PyFlink) of the tree
during the query (sparkpoint: its own process, start-up included; Spark SS and PyFlink: one process
for all queries, so a JVM heap grown by an earlier query counts in later ones). Ratios: sparkpoint / peer of events/s per query both ran; their geometric mean.
A query a peer cannot express gives a row with `cannot_express` and the reason.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from process_tree import TreeSampler, tree_cpu_s  # noqa: E402

EXAMPLES = REPO / "examples" / "nexmark"
QUERIES = sorted((p.stem for p in EXAMPLES.glob("q*.py")), key=lambda q: int(q[1:]))
SYSTEMS = ("sparkpoint", "spark-ss", "pyflink")
PEERS = ("spark-ss", "pyflink")
CHECKPOINT_INTERVAL = "1 s"
PYFLINK_VENV_PY = HERE / ".venv-pyflink" / "bin" / "python"
_PORT = re.compile(r"REST API: http://127\.0\.0\.1:(\d+)/")
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an http_proxy


# -- input ----------------------------------------------------------------------------------------------

def ensure_input(work: str, events: int, files_per_stream: int) -> str:
    """The generated streams under <work>/nexmark-<N>-<F>/, written once (a marker says complete)."""
    root = os.path.join(os.path.abspath(work), f"nexmark-{events}-{files_per_stream}")
    marker = os.path.join(root, "complete")
    if not os.path.exists(marker):
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "sparkpoint.ops.cli", "nexmark", "generate", "--events", str(events),
                        "--out", root, "--files-per-stream", str(files_per_stream)], check=True, env=_env(),
                       stdout=subprocess.DEVNULL)
        Path(marker).touch()
    return root


def stream_rows(input_dir: str) -> dict[str, int]:
    import pyarrow.parquet as pq

    return {s: sum(pq.ParquetFile(os.path.join(input_dir, s, f)).metadata.num_rows
                   for f in os.listdir(os.path.join(input_dir, s)) if f.endswith(".parquet"))
            for s in ("person", "auction", "bid")}


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


# -- sparkpoint -----------------------------------------------------------------------------------------

def _get(port: int, path: str) -> Any:
    with _LOCAL.open(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
        return json.load(r)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return float(s[max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))])


def run_sparkpoint(query: str, input_dir: str, work: str, files_per_epoch: int,
                   timeout_s: float = 3600) -> dict[str, Any]:
    from sparkpoint.connectors.parquet_sink import read_committed

    root = os.path.join(os.path.abspath(work), f"nexmark-sparkpoint-{query}")
    shutil.rmtree(root, ignore_errors=True)  # else the run restores a finished job and reads nothing
    os.makedirs(root)
    out_dir = os.path.join(root, "out")
    env = dict(_env(), NEXMARK_INPUT=input_dir, NEXMARK_OUTPUT=out_dir, NEXMARK_FILES_PER_EPOCH=str(files_per_epoch),
               NEXMARK_SIDE_INPUT=os.path.join(root, "side_input.csv"))
    cmd = [sys.executable, "-m", "sparkpoint.ops.cli", "run", str(EXAMPLES / f"{query}.py"),
           "--set", f"execution.checkpointing.dir={root}/checkpoints", "--set", f"state.local.dir={root}/state",
           "--set", f"execution.checkpointing.interval={CHECKPOINT_INTERVAL}", "--set", "parallelism.default=2",
           "--set", "rest.port=0", "--set", "sparkpoint.progress=false"]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = TreeSampler(proc.pid)
    lines: list[str] = []
    port: list[int] = []

    def read_output() -> None:
        for line in proc.stdout:
            lines.append(line)
            m = _PORT.search(line)
            if m and not port:
                port.append(int(m.group(1)))

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    samples: list[tuple[float, int, float, float]] = []  # (monotonic s, records in, CPU s of the tree, wall ms)
    checkpoints: dict[int, dict[str, Any]] = {}
    job = None
    while proc.poll() is None:
        if time.monotonic() - started > timeout_s:
            proc.kill()
            raise TimeoutError(f"sparkpoint {query} ran past {timeout_s} s")
        if port:
            try:
                job = job or _get(port[0], "/jobs")["jobs"][0]["id"]
                records = int(_get(port[0], f"/jobs/{job}")["records-in"])
                samples.append((time.monotonic(), records, tree_cpu_s(proc.pid), time.time() * 1000))
                for c in _get(port[0], f"/jobs/{job}/checkpoints")["history"]:
                    if c.get("status") == "COMPLETED":
                        checkpoints[c["id"]] = c
            except (OSError, ValueError, KeyError, IndexError):
                pass  # not up yet, or gone with the finished job
        time.sleep(0.1)
    reader.join(timeout=10)
    wall = time.monotonic() - started
    sampler.stop()
    log = "".join(lines)
    Path(root, "run.log").write_text(log)
    if proc.returncode != 0:
        raise RuntimeError(f"sparkpoint {query} exited {proc.returncode}:\n" + "\n".join(log.splitlines()[-15:]))
    summary = next((ln for ln in reversed(log.splitlines()) if ln.startswith("job ")), "")
    m = re.search(r"([\d,]+) records read", summary)
    total = int(m.group(1).replace(",", "")) if m else (samples[-1][1] if samples else 0)
    seen = [s for s in samples if s[1] > 0]
    # The process may end before a poll sees the last epoch's records: count up to the last one seen.
    done = next((s for s in seen if s[1] >= seen[-1][1]), None) if seen else None
    eps = cpu_run = None
    if seen and done and done[0] > seen[0][0]:
        eps = (done[1] - seen[0][1]) / (done[0] - seen[0][0])
        cpu_run = done[2] - seen[0][2]
    durations = [c["end_to_end_duration"] for c in checkpoints.values() if c.get("end_to_end_duration") is not None]
    # As for events/s, after start-up: a checkpoint triggered before the first epoch's records were
    # seen waits for that epoch, Spark's start and first job included.
    running_ms = seen[0][3] if seen else float("inf")
    steady = [c["end_to_end_duration"] for c in checkpoints.values() if c.get("end_to_end_duration") is not None
              and (c.get("trigger_timestamp") or 0) >= running_ms]
    events_run = done[1] - seen[0][1] if done else 0
    out = {
        "system": "sparkpoint", "config": "ckpt-1s", "query": query, "events": total,
        "events_per_s": eps, "wall_s": wall, "events_per_s_incl_startup": total / wall if wall else None,
        "output_rows": read_committed(out_dir).num_rows,
        "ckpt_p50_ms": percentile(steady, 50), "ckpt_p99_ms": percentile(steady, 99),
        "ckpt_p50_ms_incl_startup": percentile(durations, 50), "ckpt_p99_ms_incl_startup": percentile(durations, 99),
        "checkpoints_completed": len(durations), "checkpoints_after_startup": len(steady), "peak_rss_mb": sampler.peak_mb,
        "peak_rss_by_process": sampler.breakdown, "cpu_s": cpu_run, "cpu_s_incl_startup": sampler.cpu_s,
        "cpu_s_per_m_events": 1e6 * cpu_run / events_run if cpu_run is not None and events_run else None,
        "summary": summary,
    }
    shutil.rmtree(root, ignore_errors=True)
    return out


# -- figures --------------------------------------------------------------------------------------------

def _fmt(v: Any, digits: int = 0) -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def by_query(results: list[dict[str, Any]], system: str) -> dict[str, dict[str, Any]]:
    """The median-events/s run of each query for `system` (cannot-express rows included)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r.get("system") == system and r.get("query") and "failed" not in r:
            runs.setdefault(r["query"], []).append(r)
    out = {}
    for q, rs in runs.items():
        measured = sorted((r for r in rs if r.get("events_per_s")), key=lambda r: r["events_per_s"])
        out[q] = measured[len(measured) // 2] if measured else rs[0]
    return out


def ratios(results: list[dict[str, Any]], peer: str) -> tuple[dict[str, float], float | None]:
    """{query: sparkpoint events/s / peer events/s} over the queries both ran, and their geometric mean."""
    sp, other = by_query(results, "sparkpoint"), by_query(results, peer)
    per = {q: sp[q]["events_per_s"] / other[q]["events_per_s"] for q in sp
           if q in other and sp[q].get("events_per_s") and other[q].get("events_per_s")}
    geo = math.exp(sum(math.log(v) for v in per.values()) / len(per)) if per else None
    return per, geo


def _cell(r: dict[str, Any] | None, notes: dict[str, int]) -> list[str]:
    if r is None:
        return ["not run"] + ["–"] * 3
    if r.get("cannot_express"):
        n = notes.setdefault(r["cannot_express"], len(notes) + 1)
        return [f"cannot express ({n})"] + ["–"] * 3
    ck = f"{_fmt(r.get('ckpt_p50_ms'))} / {_fmt(r.get('ckpt_p99_ms'))}" if r.get("ckpt_p50_ms") is not None \
        else r.get("ckpt_note", "–")
    return [_fmt(r.get("events_per_s")), ck, _fmt(r.get("peak_rss_mb")), _fmt(r.get("cpu_s_per_m_events"), 1)]


def table(results: list[dict[str, Any]]) -> str:
    """One row per query: each system's events/s, checkpoint p50/p99 ms, peak MB, CPU-s per M events,
    and the ratios; then the geometric means, and why a peer cannot express a query."""
    systems = {s: by_query(results, s) for s in SYSTEMS}
    queries = sorted({q for rs in systems.values() for q in rs}, key=lambda q: int(q[1:]))
    per = {p: ratios(results, p) for p in PEERS}
    head = ["query"]
    for s in SYSTEMS:
        head += [f"{s} events/s", "ckpt p50 / p99 ms", "peak MB", "CPU-s / M events"]
    head += ["sparkpoint / Spark SS", "sparkpoint / PyFlink"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes: dict[str, int] = {}
    for q in queries:
        cells = [q]
        for s in SYSTEMS:
            cells += _cell(systems[s].get(q), notes)
        cells += [_fmt(per[p][0].get(q), 2) for p in PEERS]
        rows.append("| " + " | ".join(cells) + " |")
    geo = [f"**{_fmt(per[p][1], 2)}** over {len(per[p][0])} queries" for p in PEERS]
    rows.append("| geometric mean | " + " | ".join([""] * 4 * len(SYSTEMS)) + " | " + " | ".join(geo) + " |")
    rows += [""] + [f"({n}) {reason}" + "  " for reason, n in notes.items()]
    return "\n".join(rows).rstrip()


# -- main -----------------------------------------------------------------------------------------------

def system_command(system: str, args: argparse.Namespace, queries: list[str], pyflink_python: str | None) -> list[str]:
    common = ["--events", str(args.events), "--queries", ",".join(queries), "--files-per-stream",
              str(args.files_per_stream), "--files-per-epoch", str(args.files_per_epoch), "--work", args.work]
    if system == "sparkpoint":
        return [sys.executable, str(HERE / "nexmark.py"), "--systems", "sparkpoint", "--results-only"] + common
    if system == "spark-ss":
        return [sys.executable, str(HERE / "nexmark_spark_ss.py")] + common
    return [pyflink_python or str(PYFLINK_VENV_PY), str(HERE / "pyflink" / "nexmark_flink.py"),
            "--jars", pyflink_jars(pyflink_python)] + common


def pyflink_jars(pyflink_python: str | None) -> str:
    """Where bench/pyflink/setup.sh put the Parquet and Hadoop jars: $PYFLINK_JARS, else jars/ in the venv."""
    venv = Path(pyflink_python or PYFLINK_VENV_PY).parent.parent
    return os.environ.get("PYFLINK_JARS") or str(venv / "jars")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--queries", default=",".join(QUERIES))
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--files-per-stream", type=int, default=20)
    parser.add_argument("--files-per-epoch", type=int, default=2)
    parser.add_argument("--work", default="/tmp/sparkpoint-bench")
    parser.add_argument("--json", default=None, help="append every RESULT to this file (JSON lines)")
    parser.add_argument("--pyflink-python", default=None)
    parser.add_argument("--results-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    queries = [q.strip() for q in args.queries.split(",") if q.strip()]
    unknown = set(queries) - set(QUERIES)
    if unknown:
        parser.error(f"unknown queries {sorted(unknown)}; examples/nexmark has {', '.join(QUERIES)}")
    input_dir = ensure_input(args.work, args.events, args.files_per_stream)
    results: list[dict[str, Any]] = []

    def emit(r: dict[str, Any]) -> None:
        r.update(events_generated=args.events, files_per_epoch=args.files_per_epoch,
                 loadavg_1m_after=os.getloadavg()[0])
        results.append(r)
        print("RESULT " + json.dumps(r), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(r) + "\n")

    for system in [s.strip() for s in args.systems.split(",") if s.strip()]:
        if system == "sparkpoint":
            for q in queries:
                try:
                    emit(run_sparkpoint(q, input_dir, args.work, args.files_per_epoch))
                except (RuntimeError, TimeoutError) as e:
                    emit({"system": "sparkpoint", "config": "ckpt-1s", "query": q, "failed": str(e)})
            continue
        if system == "pyflink" and not (args.pyflink_python or PYFLINK_VENV_PY.exists()):
            print("PyFlink skipped: no bench/.venv-pyflink (bash bench/pyflink/setup.sh)", file=sys.stderr)
            continue
        proc = subprocess.run(system_command(system, args, queries, args.pyflink_python), capture_output=True,
                              text=True, env=_env(), cwd=HERE)
        got = [json.loads(ln[len("RESULT "):]) for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        for r in got:
            emit(r)
        if proc.returncode != 0:
            print(f"{system} exited {proc.returncode}:\n" + "\n".join(proc.stderr.strip().splitlines()[-15:]),
                  file=sys.stderr)
    if not args.results_only:
        print("\n" + table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
