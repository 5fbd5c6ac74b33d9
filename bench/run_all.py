"""Run the W1 benchmarks (sparkpoint checkpoints off / every 1 s; Spark Structured
Streaming with the RocksDB and the HDFS-backed state store) round by round, print a
table of medians and write bench/RESULTS.md.

    python bench/run_all.py [--runs 3] [--events 5000000] [--keys 100000] [--epoch-records 500000]

Each round starts one fresh process per system (so both pay the same JVM start), runs a
discarded warm-up job, then every configuration once, alternating their order round by
round. The machine is shared: ratios within a round are the figures to trust.
Every run's figures go to bench/w1_runs.jsonl; `--more` adds rounds to them, and
`--more --runs 0` only rewrites RESULTS.md. bench/flink_note.md and bench/observations.md
(hand-written) are pasted into RESULTS.md when present.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib.metadata import version
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_MD = os.path.join(HERE, "RESULTS.md")
RUNS_JSONL = os.path.join(HERE, "w1_runs.jsonl")  # every run's raw figures, for --more
SCRIPTS = {"sparkpoint": "w1_keyed_aggregate.py", "spark-ss": "w1_spark_ss.py"}
CONFIGS = [("sparkpoint", "ckpt-off"), ("sparkpoint", "ckpt-on"), ("spark-ss", "rocksdb"), ("spark-ss", "hdfs")]
RATIOS = [  # (label, numerator, denominator)
    ("sparkpoint ckpt-on / ckpt-off", ("sparkpoint", "ckpt-on"), ("sparkpoint", "ckpt-off")),
    ("sparkpoint ckpt-on / Spark SS RocksDB", ("sparkpoint", "ckpt-on"), ("spark-ss", "rocksdb")),
    ("sparkpoint ckpt-on / Spark SS HDFS store", ("sparkpoint", "ckpt-on"), ("spark-ss", "hdfs")),
    ("Spark SS RocksDB / HDFS store", ("spark-ss", "rocksdb"), ("spark-ss", "hdfs")),
]


def run_script(system: str, run: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    cmd = [sys.executable, os.path.join(HERE, SCRIPTS[system]), "--events", str(args.events), "--keys",
           str(args.keys), "--epoch-records", str(args.epoch_records), "--runs", "1", "--first-run", str(run),
           "--work", args.work]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=HERE)
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{SCRIPTS[system]} (round {run}) failed with exit code {proc.returncode}:\n{tail}")
    return results


def previous_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    if not os.path.exists(RUNS_JSONL):
        return []
    with open(RUNS_JSONL) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    same = [r for r in runs if (r["keys"], r["epoch_records"]) == (args.keys, args.epoch_records)
            and r["events"] == args.events]
    if len(same) != len(runs):
        raise SystemExit(f"{RUNS_JSONL} holds runs with other settings; run without --more to start over")
    return runs


def environment() -> dict[str, Any]:
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    with open("/proc/meminfo") as f:
        mem_kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(), "ram_gib": round(mem_kb / 2**20, 1),
        "python": sys.version.split()[0], "pyspark": version("pyspark"), "pyarrow": version("pyarrow"),
        "rocksdict": version("rocksdict"), "java": java[0] if java else "?",
    }


def median_of(results: list[dict[str, Any]], system: str, config: str, field: str) -> float | None:
    values = [r[field] for r in results if r["system"] == system and r["config"] == config and r.get(field) is not None]
    return statistics.median(values) if values else None


def ratios(results: list[dict[str, Any]]) -> list[tuple[str, float | None, float | None]]:
    """(label, ratio of the medians, median of the per-round ratios)."""
    out = []
    for label, num, den in RATIOS:
        a, b = median_of(results, *num, "events_per_s"), median_of(results, *den, "events_per_s")
        by_round = []
        for run in sorted({r["run"] for r in results}):
            x = [r["events_per_s"] for r in results if (r["system"], r["config"]) == num and r["run"] == run]
            y = [r["events_per_s"] for r in results if (r["system"], r["config"]) == den and r["run"] == run]
            if x and y:
                by_round.append(x[0] / y[0])
        out.append((label, a / b if a and b else None, statistics.median(by_round) if by_round else None))
    return out


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, float) and v >= 100 or isinstance(v, int):
        return f"{v:,.0f}{unit}"
    return f"{v:.2f}{unit}"


def _load_range(results: list[dict[str, Any]]) -> str:
    loads = [r["loadavg_1m_after"] for r in results if r.get("loadavg_1m_after") is not None]
    return f"{min(loads):.1f}–{max(loads):.1f} (median {statistics.median(loads):.1f})" if loads else "–"


def summary_table(results: list[dict[str, Any]]) -> str:
    rows = ["| system | config | events/s after start-up (median) | runs (events/s) | epoch / batch s (median) "
            "| checkpoint p50 / p99 ms | state commit ms (median) | bytes per checkpoint (median) |",
            "|---|---|---|---|---|---|---|---|"]
    for system, config in CONFIGS:
        runs = [r for r in results if r["system"] == system and r["config"] == config]
        if not runs:
            continue
        m = lambda f: median_of(results, system, config, f)  # noqa: E731
        per_run = ", ".join(f"{r['events_per_s']:,.0f}" for r in sorted(runs, key=lambda r: r["run"]))
        if system == "sparkpoint":
            epoch = m("epoch_s_median")
            ckpt = f"{_fmt(m('ckpt_p50_ms'))} / {_fmt(m('ckpt_p99_ms'))}" if config == "ckpt-on" else "– (off)"
            commit, size = "–", _fmt(m("ckpt_bytes_median"), " B") if config == "ckpt-on" else "–"
        else:
            epoch = (m("batch_ms_median") or 0) / 1000
            ckpt = "every batch (not reported)"
            commit = _fmt(m("state_commit_ms_median"))
            size = "state dir at end: " + _fmt(m("state_dir_bytes_end"), " B")
        rows.append(f"| {system} | {config} | {_fmt(m('events_per_s'))} | {per_run} | {_fmt(epoch)} | {ckpt} "
                    f"| {commit} | {size} |")
    return "\n".join(rows)


def write_results_md(env: dict[str, Any], args: argparse.Namespace, results: list[dict[str, Any]],
                     load: tuple[float, float], notes: str) -> None:
    ratio_rows = "\n".join(f"| {label} | {_fmt(a)} | {_fmt(b)} |" for label, a, b in ratios(results))
    raw = "\n".join(json.dumps(r) for r in sorted(results, key=lambda r: (r["system"], r["config"], r["run"])))
    text = f"""# Benchmark results

Written by `python bench/run_all.py --runs {args.runs} --events {args.events} --keys {args.keys} \
--epoch-records {args.epoch_records}` (re-running overwrites this file).

## Machine and versions
- date: {env['date']}; nproc: {env['nproc']}; RAM: {env['ram_gib']} GiB
- load average (1 min) at start / end: {load[0]:.2f} / {load[1]:.2f}; after each run: {_load_range(results)}
  — the machine is shared with other work (test suites and Spark jobs of other helpers) running at
  the same time: absolute numbers drift a lot, ratios measured side by side in one round hold better.
- Python {env['python']}, pyspark {env['pyspark']}, pyarrow {env['pyarrow']}, rocksdict {env['rocksdict']},
  java: `{env['java']}`

## W1 keyed aggregate: settings
- Events: N = {args.events:,} (not the 20 M of BENCHMARKS.md, to keep each configuration short on a
  loaded 2-core machine), keys uniform over K = {args.keys:,}, value 0..999; the records of
  `GeneratorSource(seed=7, splits=2)`; per key `count(*)` and `sum(value)`, unwindowed, update mode.
- Batches: {args.epoch_records:,} events per sparkpoint epoch (`max_records_per_epoch`, no rate limit);
  Spark SS reads the same events from Parquet files written from the same generator slices,
  one file per epoch, `maxFilesPerTrigger=1`, so batches are the same size.
- Both: `local[2]`, `spark.sql.shuffle.partitions=2`, AQE off, driver 2 GiB, output written as
  Parquet (sparkpoint: `ParquetSink`, two-phase commit; Spark SS: `foreachBatch` →
  `batch.write.parquet(.../batch=<id>)`).
- sparkpoint: in-process `JobMaster`, parallelism 2, `KeyedAggregate("w1", ["key"], "value",
  aggs=("count", "sum"), value_type="bigint")`, checkpoint storage a local directory;
  `execution.checkpointing.enabled=false` (ckpt-off) or `execution.checkpointing.interval=1 s`
  (ckpt-on, other checkpoint settings default: max-concurrent 1, incremental uploads).
- Spark SS: `groupBy("key").agg(count, sum)`, `outputMode("update")`,
  `trigger(processingTime="100 milliseconds")` (shorter than a batch: the query never waits);
  state store `RocksDBStateStoreProvider` with
  `spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled=true`, or the default
  `HDFSBackedStateStoreProvider`. Spark SS commits state every batch; its comparison point is
  sparkpoint with checkpoints on.
- events/s after start-up: events from the end of epoch/batch 0 to the end of the last epoch/batch
  with data, divided by that time (excludes Spark start-up and warm-up of batch 0, and sparkpoint's
  final empty epoch and final checkpoint). Each round runs one fresh process per system with a
  discarded 1 M-event warm-up job, then each configuration once, alternating the order.
- Checkpoint p50/p99: sparkpoint's trigger-to-complete duration (`coordinator.stats`); bytes per
  checkpoint: uploaded bytes per completed checkpoint (incremental: only new SST files). Spark SS
  state commit: `stateOperators[0].commitTimeMs` per batch.

## W1 results (median of {args.runs} rounds)
{summary_table(results)}

## Ratios (throughput after start-up)
| ratio | of the medians | median of the per-round ratios |
|---|---|---|
{ratio_rows}

{notes}

## Raw runs
```
{raw}
```
"""
    with open(RESULTS_MD, "w") as f:
        f.write(text)


NOTES = """{observations}

## Flink (PyFlink)
{flink}

## Not measured in this run
W2 (tumbling window) and W3 (10 M keys state, restore after SIGKILL) of BENCHMARKS.md, and K = 1 M
keys for W1."""


def _read_or(path: str, default: str) -> str:
    return open(path).read().strip() if os.path.exists(path) else default


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--epoch-records", type=int, default=500_000)
    parser.add_argument("--work", default="/tmp/sparkpoint-bench")
    parser.add_argument("--more", action="store_true",
                        help=f"keep the runs in {os.path.basename(RUNS_JSONL)} (same settings) and add --runs "
                             "rounds; --more --runs 0 only rewrites RESULTS.md from them")
    args = parser.parse_args()
    env = environment()
    load_start = os.getloadavg()[0]
    results = previous_runs(args) if args.more else []
    first = max((r["run"] for r in results), default=-1) + 1
    for run in range(first, first + args.runs):
        for system in SCRIPTS:
            started = time.monotonic()
            got = run_script(system, run, args)
            results += got
            for r in got:
                print(f"round {run} {system:10s} {r['config']:8s} {r['events_per_s']:>12,.0f} events/s "
                      f"(load {r.get('loadavg_1m_after', 0):.1f})", flush=True)
            print(f"round {run} {system}: {time.monotonic() - started:.0f} s", flush=True)
            with open(RUNS_JSONL, "w") as f:  # after every round, so a cut-short run keeps what it measured
                f.writelines(json.dumps(r) + "\n" for r in results)
    args.runs = len({r["run"] for r in results})
    flink = _read_or(os.path.join(HERE, "flink_note.md"), "Not measured.")
    observations = _read_or(os.path.join(HERE, "observations.md"), "")
    write_results_md(env, args, results, (load_start, os.getloadavg()[0]),
                     NOTES.format(flink=flink, observations=observations))
    print(summary_table(results))
    for label, a, b in ratios(results):
        print(f"{label}: {_fmt(a)} (median of per-round ratios {_fmt(b)})")


if __name__ == "__main__":
    main()
