"""Run the benchmarks (W1, W2, W3, latency, custom processor, Nexmark) round by round and write bench/RESULTS.md with plots.

    python bench/run_all.py [--only w1,w1-1m,w1-e1m,w2,w2-sliding,w2-session,w3,latency,processor,nexmark] [--runs 3]
        [--events 5000000]
        [--keys 100000] [--keys-1m 1000000] [--epoch-records 500000] [--big-epoch-records 1000000]
        [--processor-events 2000000] [--processor-keys 10000] [--processor-epoch-records 100000]
        [--nexmark-events 10000000] [--nexmark-queries q0,q1,...]
        [--more] [--results-dir bench]

Sections (default: all of them):
  w1       W1 keyed aggregate, N = --events, K = --keys (100 k): sparkpoint ckpt-off/ckpt-on
           (bench/w1_keyed_aggregate.py), Spark SS rocksdb/hdfs (bench/w1_spark_ss.py), PyFlink
           hashmap-ckpt/hashmap-off/rocksdb-ckpt (bench/pyflink/w1_flink.py --workload w1).
  w1-1m    the same at K = --keys-1m (1 M).
  w1-e1m   W1 at K = --keys with epochs (and Spark SS batches) of --big-epoch-records (1 M) events
           and 2 N events: the epoch size is sparkpoint's own knob (`max_records_per_epoch`).
  w2       W2 60 s tumbling window, same N and K: sparkpoint (bench/w2_window.py), Spark SS
           (bench/w2_spark_ss.py), PyFlink (--workload w2).
  w2-sliding  W2's events in 60 s windows sliding every 10 s: the same three scripts with
           `--window sliding` (PyFlink: --workload w2-sliding, a HOP window TVF).
  w2-session  W2's events in sessions with a 30 s gap: `--window session` (PyFlink: --workload
           w2-session, a SESSION window TVF). Sizes and why: bench/w2_windows.py.
  w3       W3 large state (bench/w3_large_state.py, --w3-keys 10 M): one run by default.
  latency  end-to-end latency at a steady rate, one fresh process per system: sparkpoint and Spark
           SS micro-batch (bench/latency.py), Spark SS real-time mode over Kafka
           (bench/latency_spark_rtm.py; at-least-once output) and PyFlink with its exactly-once file
           sink (bench/pyflink/latency_flink.py, when its venv is set up): one run by default.
  processor  the README's Sessionize processor on sparkpoint and on Spark's
           transformWithStateInPandas, same processor body and Parquet input (bench/processor_tws.py,
           one fresh process per system, order alternating): one round by default.
  nexmark  every examples/nexmark query (--nexmark-queries) on --nexmark-events generated events, one
           query at a time on sparkpoint (`sparkpoint run examples/nexmark/qN.py`), Spark SS
           (bench/nexmark_spark_ss.py) and PyFlink (bench/pyflink/nexmark_flink.py, nexmark-flink's SQL),
           as bench/nexmark.py runs them: one round by default.

Each round of w1/w1-1m/w1-e1m/w2/w2-sliding/w2-session starts one fresh process per system (each pays its
JVM start and runs a discarded warm-up job), then every configuration of that system once; the order of the systems and
of the configurations alternates round by round. The machine is shared: ratios within a round are
the figures to trust. PyFlink runs in bench/.venv-pyflink (`bash bench/pyflink/setup.sh` is called
first; when it fails, PyFlink is skipped and RESULTS.md says why).

Every run's RESULT dict (with `section` and `sitting` added) is appended to <results-dir>/runs.jsonl,
with one `{"sitting": ...}` line per invocation (machine, versions, load at start/end). Without
--more, the runs of the selected sections are dropped first (other sections are kept); with --more
rounds are added to them; `--more --runs 0` runs nothing and only rewrites RESULTS.md and the plots
from runs.jsonl. The W1 runs of the older <results-dir>/w1_runs.jsonl are shown as section w1 when
runs.jsonl has none. bench/observations.md (hand-written) is pasted into RESULTS.md.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib.metadata import version
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PYFLINK_SETUP = os.path.join(HERE, "pyflink", "setup.sh")
PYFLINK_VENV_PY = os.path.join(HERE, ".venv-pyflink", "bin", "python")
SECTIONS = ["w1", "w1-1m", "w1-e1m", "w2", "w2-sliding", "w2-session", "w3", "latency", "processor", "nexmark"]
ONE_ROUND_SECTIONS = ("w3", "latency", "processor", "nexmark")
THROUGHPUT_SECTIONS = ["w1", "w1-1m", "w1-e1m", "w2", "w2-sliding", "w2-session"]
SECTION_TITLES = {"w1": "W1 keyed aggregate, K = 100 k", "w1-1m": "W1 keyed aggregate, K = 1 M",
                  "w1-e1m": "W1 keyed aggregate, K = 100 k, epochs of 1 M events",
                  "w2": "W2 tumbling window (60 s)", "w2-sliding": "W2 sliding window (60 s every 10 s)",
                  "w2-session": "W2 session window (30 s gap)", "w3": "W3 large state",
                  "latency": "End-to-end latency",
                  "processor": "Custom processor: the README's Sessionize, sparkpoint vs Spark transformWithStateInPandas",
                  "nexmark": "Nexmark"}
# The W2 variants: section -> the scripts' --window. All three systems get the same event-time
# density (W2's sparkpoint and Spark SS default; W2's own PyFlink runs keep Flink's 10,000).
W2_VARIANTS = {"w2-sliding": "sliding", "w2-session": "session"}
W2_VARIANT_EVENT_TIME_PER_S = 5_000
CONFIGS = [("sparkpoint", "ckpt-off"), ("sparkpoint", "ckpt-on"), ("sparkpoint", "ckpt-on-parquet"),
           ("sparkpoint", "ckpt-on-timed"),
           ("spark-ss", "rocksdb"), ("spark-ss", "hdfs"),
           ("pyflink", "hashmap-ckpt"), ("pyflink", "hashmap-off"), ("pyflink", "rocksdb-ckpt")]
PYFLINK_CONFIGS = "hashmap-ckpt,hashmap-off,rocksdb-ckpt"
TARGETS = {"faster_ss": 1.5, "flink": 1.0, "off": 0.97, "p50": 500, "p99": 1000, "w3_ratio": 1.2, "w3_disk": 0.5,
           "processor": 1.0}
# The W2 variants' targets: vectorized window state (sparkpoint ckpt-on against the peers, checkpoint p50).
VARIANT_TARGETS = {"faster_ss": 1.0, "flink": 0.5, "off": None, "p50": 1000, "p99": None}


def section_targets(section: str) -> dict[str, Any]:
    return VARIANT_TARGETS if section in W2_VARIANTS else TARGETS


# -- running --------------------------------------------------------------------------------------------

def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, REPO, os.environ.get("PYTHONPATH", "")]))


def run_command(label: str, cmd: list[str], timeout: float | None = None) -> list[dict[str, Any]]:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=HERE, timeout=timeout)
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        tail = "\n".join((proc.stderr.strip() or proc.stdout.strip()).splitlines()[-15:])
        raise RuntimeError(f"{label} failed with exit code {proc.returncode}:\n{tail}")
    return results


def _common(args: argparse.Namespace, keys: int, run: int, section: str) -> list[str]:
    big = section == "w1-e1m"
    out = ["--events", str(2 * args.events if big else args.events), "--keys", str(keys),
           "--epoch-records", str(args.big_epoch_records if big else args.epoch_records),
           "--runs", "1", "--first-run", str(run), "--work", args.work]
    if args.warmup_events is not None:
        out += ["--warmup-events", str(args.warmup_events)]
    return out


def throughput_jobs(section: str, args: argparse.Namespace, run: int,
                    pyflink_python: str | None) -> list[tuple[str, list[str]]]:
    """(system, command) of one round of a throughput section."""
    keys = args.keys_1m if section == "w1-1m" else args.keys
    py = sys.executable
    w2_family = section == "w2" or section in W2_VARIANTS
    if w2_family:
        jobs = [("sparkpoint", [py, os.path.join(HERE, "w2_window.py")]),
                ("spark-ss", [py, os.path.join(HERE, "w2_spark_ss.py")])]
    else:
        jobs = [("sparkpoint", [py, os.path.join(HERE, "w1_keyed_aggregate.py")]),
                ("spark-ss", [py, os.path.join(HERE, "w1_spark_ss.py")])]
    if pyflink_python:
        jobs.append(("pyflink", [pyflink_python, os.path.join(HERE, "pyflink", "w1_flink.py"), "--workload",
                                 section if w2_family else "w1", "--configs", PYFLINK_CONFIGS]))
    if section == "w1-e1m":  # the generator and Parquet epochs are the same: no parquet-source run
        jobs[0] = (jobs[0][0], jobs[0][1] + ["--modes", "off,on"])
    if section in W2_VARIANTS:
        variant = ["--event-time-per-s", str(W2_VARIANT_EVENT_TIME_PER_S)]
        jobs = [(system, cmd + variant + ([] if system == "pyflink" else ["--window", W2_VARIANTS[section]]))
                for system, cmd in jobs]
    jobs = [(system, cmd + _common(args, keys, run, section)) for system, cmd in jobs]
    return jobs if run % 2 == 0 else jobs[::-1]


def w3_command(args: argparse.Namespace, run: int) -> list[str]:
    return [sys.executable, os.path.join(HERE, "w3_large_state.py"), "--keys", str(args.w3_keys),
            "--runs", "1", "--first-run", str(run), "--restore-modes", args.w3_restore_modes,
            "--work", args.work + "-w3"]


def processor_jobs(args: argparse.Namespace, run: int) -> list[tuple[str, list[str]]]:
    """(system, command) of one round of the processor section: one fresh process per system."""
    common = ["--events", str(args.processor_events), "--keys", str(args.processor_keys),
              "--epoch-records", str(args.processor_epoch_records), "--runs", "1", "--first-run", str(run),
              "--work", args.work]
    if args.processor_warmup_events is not None:
        common += ["--warmup-events", str(args.processor_warmup_events)]
    script = os.path.join(HERE, "processor_tws.py")
    jobs = [(system, [sys.executable, script, "--systems", system] + common) for system in ("sparkpoint", "spark-tws")]
    return jobs if run % 2 == 0 else jobs[::-1]


def nexmark_jobs(args: argparse.Namespace, run: int, pyflink_python: str | None) -> list[tuple[str, list[str]]]:
    """(system, command) of one round of the nexmark section; the input is generated first."""
    import nexmark

    options = argparse.Namespace(events=args.nexmark_events, files_per_stream=args.nexmark_files_per_stream,
                                 files_per_epoch=args.nexmark_files_per_epoch, work=args.work)
    nexmark.ensure_input(args.work, args.nexmark_events, args.nexmark_files_per_stream)
    queries = [q.strip() for q in (args.nexmark_queries or ",".join(nexmark.QUERIES)).split(",") if q.strip()]
    systems = ["sparkpoint", "spark-ss"] + (["pyflink"] if pyflink_python else [])
    jobs = [(system, nexmark.system_command(system, options, queries, pyflink_python)) for system in systems]
    return jobs if run % 2 == 0 else jobs[::-1]


def latency_command(args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, os.path.join(HERE, "latency.py"), "--rate", str(args.latency_rate),
           "--duration-s", str(args.latency_duration_s), "--keys", str(args.keys), "--work", args.work]
    if args.latency_warmup_s is not None:
        cmd += ["--warmup-s", str(args.latency_warmup_s)]
    return cmd


def latency_jobs(args: argparse.Namespace, pyflink_python: str | None) -> list[tuple[str, list[str]]]:
    """(system, command) of the latency section: sparkpoint and Spark SS micro-batch
    (latency.py), Spark SS in real-time mode over Kafka (its output is at-least-once:
    Spark's Kafka sink), and PyFlink with its exactly-once file sink when its venv is there."""
    same = ["--rate", str(args.latency_rate), "--duration-s", str(args.latency_duration_s),
            "--keys", str(args.keys), "--work", args.work]
    jobs = [("sparkpoint, spark-ss", latency_command(args)),
            ("spark-ss-rtm", [sys.executable, os.path.join(HERE, "latency_spark_rtm.py"), *same])]
    if pyflink_python:
        jobs.append(("pyflink", [pyflink_python, os.path.join(HERE, "pyflink", "latency_flink.py"), *same]))
    return jobs


def setup_pyflink() -> tuple[str | None, str]:
    """(the PyFlink venv's python or None, status text for RESULTS.md)."""
    try:
        proc = subprocess.run(["bash", PYFLINK_SETUP], capture_output=True, text=True, timeout=1200)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"`bash bench/pyflink/setup.sh` failed: {e!r}"
    if proc.returncode != 0:
        tail = " / ".join(proc.stderr.strip().splitlines()[-4:])
        return None, f"`bash bench/pyflink/setup.sh` failed (exit {proc.returncode}): {tail}"
    lines = proc.stdout.strip().splitlines()
    python = lines[-1].strip() if lines else PYFLINK_VENV_PY
    return python, "ok"


def environment(pyflink_python: str | None) -> dict[str, Any]:
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    with open("/proc/meminfo") as f:
        mem_kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    flink = None
    pyflink_python = pyflink_python or (PYFLINK_VENV_PY if os.path.exists(PYFLINK_VENV_PY) else None)
    if pyflink_python:
        proc = subprocess.run([pyflink_python, "-c", "from importlib.metadata import version; "
                               "print(version('apache-flink'))"], capture_output=True, text=True)
        flink = proc.stdout.strip() or None
    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(), "ram_gib": round(mem_kb / 2**20, 1),
        "python": sys.version.split()[0], "pyspark": version("pyspark"), "pyarrow": version("pyarrow"),
        "rocksdict": version("rocksdict"), "java": java[0] if java else "?", "flink": flink,
    }


# -- the raw file ---------------------------------------------------------------------------------------

def read_raw(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_raw(path: str, records: list[dict[str, Any]]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(tmp, path)


def section_settings(section: str, args: argparse.Namespace) -> dict[str, Any]:
    if section == "w1-e1m":
        return {"events": 2 * args.events, "keys": args.keys, "epoch_records": args.big_epoch_records}
    if section in ("w1", "w1-1m", "w2", *W2_VARIANTS):
        return {"events": args.events, "keys": args.keys_1m if section == "w1-1m" else args.keys}
    if section == "w3":
        return {"keys": args.w3_keys}
    if section == "processor":
        return {"events": args.processor_events, "keys": args.processor_keys}
    if section == "nexmark":
        return {"events_generated": args.nexmark_events}
    return {"rate": args.latency_rate}


def check_same_settings(records: list[dict[str, Any]], section: str, args: argparse.Namespace) -> None:
    want = section_settings(section, args)
    for r in records:
        if r.get("section") != section or "system" not in r or "failed" in r:
            continue
        got = {k: r.get(k) for k in want if r.get(k) is not None}
        if any(got[k] != want[k] for k in got):
            raise SystemExit(f"{args.raw} holds {section} runs with {got}, not {want}; "
                             f"run without --more to start {section} over")


# -- figures --------------------------------------------------------------------------------------------

def runs_of(results: list[dict[str, Any]], section: str, system: str | None = None,
            config: str | None = None) -> list[dict[str, Any]]:
    return [r for r in results if r.get("section") == section and "failed" not in r
            and (system is None or r["system"] == system) and (config is None or r["config"] == config)]


def median_of(results: list[dict[str, Any]], field: str) -> float | None:
    values = [r[field] for r in results if r.get(field) is not None]
    return statistics.median(values) if values else None


def mean_of(results: list[dict[str, Any]], field: str) -> float | None:
    values = [r[field] for r in results if r.get(field) is not None]
    return statistics.mean(values) if values else None


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int) or isinstance(v, float) and abs(v) >= 100:
        return f"{v:,.0f}{unit}"
    return f"{v:.2f}{unit}"


def _load_range(results: list[dict[str, Any]]) -> str:
    loads = [r["loadavg_1m_after"] for r in results if r.get("loadavg_1m_after") is not None]
    return f"{min(loads):.1f}–{max(loads):.1f} (median {statistics.median(loads):.1f})" if loads else "–"


def _met(value: float | None, target: float, at_least: bool) -> str:
    if value is None:
        return "not measured"
    ok = value >= target if at_least else value <= target
    return "**met**" if ok else "not met"


def throughput_table(results: list[dict[str, Any]], section: str) -> str:
    rows = ["| system | config | events/s after start-up (median) | runs (events/s) | epoch / batch s (median) "
            "| checkpoint p50 / p99 ms (median) | state commit ms (median) | bytes per checkpoint (median) "
            "| CPU µs per event (median) | load (1 min) after each run |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for system, config in CONFIGS:
        runs = sorted(runs_of(results, section, system, config), key=lambda r: r["run"])
        if not runs:
            continue
        m = lambda f: median_of(runs, f)  # noqa: E731
        per_run = ", ".join(f"{r['events_per_s']:,.0f}" for r in runs)
        loads = ", ".join(f"{r['loadavg_1m_after']:.1f}" for r in runs if r.get("loadavg_1m_after") is not None)
        ckpt_on = config.startswith("ckpt-on") or config.endswith("-ckpt")
        if system == "spark-ss":
            epoch = (m("batch_ms_median") or 0) / 1000
            ckpt = "every batch (not reported)"
            commit = _fmt(m("state_commit_ms_median"))
            size = "state dir at end: " + _fmt(m("state_dir_bytes_end"), " B")
        else:
            epoch = m("epoch_s_median")
            ckpt = f"{_fmt(m('ckpt_p50_ms'))} / {_fmt(m('ckpt_p99_ms'))}" if ckpt_on else "– (off)"
            commit = "–"
            size = _fmt(m("ckpt_bytes_median"), " B") if ckpt_on else "–"
        rows.append(f"| {system} | {config} | {_fmt(m('events_per_s'))} | {per_run} | {_fmt(epoch)} | {ckpt} "
                    f"| {commit} | {size} | {_fmt(m('cpu_us_per_event'))} | {loads} |")
    return "\n".join(rows)


def _round_ratio(results: list[dict[str, Any]], section: str, num: Callable, den: Callable) -> float | None:
    """Median over rounds (run numbers) of num(round's runs) / den(round's runs)."""
    by_round = []
    for run in sorted({r["run"] for r in runs_of(results, section)}):
        rr = [r for r in runs_of(results, section) if r["run"] == run]
        a, b = num(rr), den(rr)
        if a and b:
            by_round.append(a / b)
    return statistics.median(by_round) if by_round else None


def _eps(system: str, config: str) -> Callable[[list[dict[str, Any]]], float | None]:
    return lambda rr: median_of([r for r in rr if (r["system"], r["config"]) == (system, config)], "events_per_s")


def _faster_ss(rr: list[dict[str, Any]]) -> float | None:
    values = [v for v in (_eps("spark-ss", "rocksdb")(rr), _eps("spark-ss", "hdfs")(rr)) if v]
    return max(values) if values else None


def throughput_ratios(results: list[dict[str, Any]], section: str) -> str:
    runs = runs_of(results, section)
    targets = section_targets(section)
    on = _eps("sparkpoint", "ckpt-on")
    rows = ["| ratio | of the medians | median of the per-round ratios | target | met (medians) |",
            "|---|---|---|---|---|"]
    specs = [
        ("sparkpoint ckpt-on / Spark SS faster store (max of RocksDB, HDFS medians)", on, _faster_ss,
         targets["faster_ss"], True),
        ("sparkpoint ckpt-on / PyFlink hashmap-ckpt", on, _eps("pyflink", "hashmap-ckpt"), targets["flink"], True),
        ("sparkpoint ckpt-on / ckpt-off", on, _eps("sparkpoint", "ckpt-off"), targets["off"], True),
        ("sparkpoint ckpt-on-parquet (same Parquet input as Spark SS) / Spark SS faster store",
         _eps("sparkpoint", "ckpt-on-parquet"), _faster_ss, None, True),
        ("sparkpoint ckpt-on-parquet / PyFlink hashmap-ckpt", _eps("sparkpoint", "ckpt-on-parquet"),
         _eps("pyflink", "hashmap-ckpt"), None, True),
        ("sparkpoint ckpt-on-timed (epochs sized to 0.5 s) / Spark SS faster store",
         _eps("sparkpoint", "ckpt-on-timed"), _faster_ss, None, True),
        ("sparkpoint ckpt-on-timed / PyFlink hashmap-ckpt", _eps("sparkpoint", "ckpt-on-timed"),
         _eps("pyflink", "hashmap-ckpt"), None, True),
        ("sparkpoint ckpt-on-timed / ckpt-on", _eps("sparkpoint", "ckpt-on-timed"), on, None, True),
        ("sparkpoint ckpt-on / Spark SS RocksDB", on, _eps("spark-ss", "rocksdb"), None, True),
        ("sparkpoint ckpt-on / Spark SS HDFS store", on, _eps("spark-ss", "hdfs"), None, True),
        ("sparkpoint ckpt-on / PyFlink rocksdb-ckpt", on, _eps("pyflink", "rocksdb-ckpt"), None, True),
        ("PyFlink hashmap-ckpt / hashmap-off", _eps("pyflink", "hashmap-ckpt"), _eps("pyflink", "hashmap-off"),
         None, True),
    ]
    for label, num, den, target, at_least in specs:
        a, b = num(runs), den(runs)
        if target is None and a is None:
            continue  # a configuration this section does not run (ckpt-on-parquet is W1's)
        ratio = a / b if a and b else None
        per_round = _round_ratio(results, section, num, den)
        tgt = "–" if target is None else f"{'≥' if at_least else '≤'} {target}"
        met = "–" if target is None else _met(ratio, target, at_least)
        rows.append(f"| {label} | {_fmt(ratio)} | {_fmt(per_round)} | {tgt} | {met} |")
    ck = runs_of(results, section, "sparkpoint", "ckpt-on")
    for q in ("p50", "p99"):
        v, target = median_of(ck, f"ckpt_{q}_ms"), targets[q]
        tgt, met = ("–", "–") if target is None else (f"≤ {target}", _met(v, target, False))
        rows.append(f"| sparkpoint checkpoint {q} (ms, median of runs) | {_fmt(v)} | – | {tgt} | {met} |")
    timed = runs_of(results, section, "sparkpoint", "ckpt-on-timed")
    if timed:
        for q, key in (("p50", "ckpt_p50_ms"), ("p99", "ckpt_p99_ms")):
            v = median_of(timed, key)
            rows.append(f"| sparkpoint ckpt-on-timed checkpoint {q} (ms, median of runs) | {_fmt(v)} | – "
                        f"| ≤ {TARGETS[q]} | {_met(v, TARGETS[q], False)} |")
    return "\n".join(rows)


PROCESSOR_SYSTEMS = [("sparkpoint", "ckpt-on"), ("spark-tws", "rocksdb")]


def processor_table(results: list[dict[str, Any]]) -> str:
    rows = ["| system | config | events/s after start-up (median) | runs (events/s) | epoch / batch s (median) "
            "| checkpoint p50 / p99 ms (median) | state commit ms (median) | sessions (= pandas) "
            "| CPU µs per event (median) | peak memory MB (median) | load (1 min) after each run |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for system, config in PROCESSOR_SYSTEMS:
        runs = sorted(runs_of(results, "processor", system, config), key=lambda r: r["run"])
        if not runs:
            continue
        m = lambda f: median_of(runs, f)  # noqa: E731
        per_run = ", ".join(f"{r['events_per_s']:,.0f}" for r in runs)
        loads = ", ".join(f"{r['loadavg_1m_after']:.1f}" for r in runs if r.get("loadavg_1m_after") is not None)
        if system == "spark-tws":
            epoch, ckpt, commit = (m("batch_ms_median") or 0) / 1000, "every batch (not reported)", _fmt(m("state_commit_ms_median"))
        else:
            epoch, ckpt, commit = m("epoch_s_median"), f"{_fmt(m('ckpt_p50_ms'))} / {_fmt(m('ckpt_p99_ms'))}", "–"
        rows.append(f"| {system} | {config} | {_fmt(m('events_per_s'))} | {per_run} | {_fmt(epoch)} | {ckpt} "
                    f"| {commit} | {_fmt(m('sessions'))} | {_fmt(m('cpu_us_per_event'))} | {_fmt(m('peak_rss_mb'))} "
                    f"| {loads} |")
    return "\n".join(rows)


def processor_ratios(results: list[dict[str, Any]]) -> str:
    runs = runs_of(results, "processor")
    sp, tws = _eps(*PROCESSOR_SYSTEMS[0]), _eps(*PROCESSOR_SYSTEMS[1])
    a, b = sp(runs), tws(runs)
    ratio = a / b if a and b else None
    per_round = _round_ratio(results, "processor", sp, tws)
    # Every run checked its sessions against pandas; the digests say both systems emitted the same ones.
    digests = {r.get("sessions_sha256") for r in runs if r.get("sessions_sha256")}
    same = "yes" if len(digests) == 1 else ("–" if not digests else f"**no** ({len(digests)} different)")
    return "\n".join([
        "| ratio | of the medians | median of the per-round ratios | target | met (medians) |",
        "|---|---|---|---|---|",
        f"| sparkpoint ckpt-on / Spark transformWithStateInPandas (RocksDB) | {_fmt(ratio)} | {_fmt(per_round)} "
        f"| ≥ {TARGETS['processor']} | {_met(ratio, TARGETS['processor'], True)} |",
        f"\nSame sessions from every run of both systems (sha256 of the sorted sessions): {same}."])


W3_FIELDS = [("ratio_uploaded_to_changed", "uploaded / changed (median)"),
             ("ratio_uploaded_to_changed_mean", "uploaded / changed (mean)"),
             ("bytes_per_checkpoint_median", "bytes per checkpoint"), ("changed_state_bytes", "changed bytes"),
             ("ckpt_ms_median", "checkpoint ms"), ("load_phase_s", "load phase s"),
             ("state_bytes_at_kill", "state bytes at kill"), ("restore_s", "restore s"),
             ("restore_bytes", "restore bytes"), ("restore_mb_per_s", "restore MB/s"),
             ("disk_read_mb_per_s", "disk read MB/s"), ("restore_fraction_of_disk", "restore / disk"),
             ("state_rebuild_s_max", "state rebuild s"), ("peak_rss_driver_mb", "peak RSS driver MB"),
             ("peak_rss_executors_mb", "peak RSS executors MB"), ("peak_pss_executors_mb", "peak PSS executors MB")]


def w3_table(results: list[dict[str, Any]]) -> str:
    configs = sorted({r["config"] for r in runs_of(results, "w3")})
    rows = ["| figure | " + " | ".join(configs) + " |", "|---|" + "---|" * len(configs)]
    for field, label in W3_FIELDS:
        cells = []
        for config in configs:
            runs = sorted(runs_of(results, "w3", None, config), key=lambda r: r["run"])
            med = median_of(runs, field)
            per = ", ".join(_fmt(r.get(field)) for r in runs)
            cells.append(_fmt(med) + (f" ({per})" if len(runs) > 1 else ""))
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    loads = [", ".join(f"{r['loadavg_1m_after']:.1f}" for r in runs_of(results, "w3", None, c)
                       if r.get("loadavg_1m_after") is not None) for c in configs]
    rows.append("| load (1 min) after | " + " | ".join(loads) + " |")
    return "\n".join(rows)


def w3_targets(results: list[dict[str, Any]]) -> str:
    runs = runs_of(results, "w3")
    rows = ["| figure | value | target | met |", "|---|---|---|---|"]
    for field, label in [("ratio_uploaded_to_changed", "uploaded / changed bytes per checkpoint, median"),
                         ("ratio_uploaded_to_changed_mean", "uploaded / changed bytes, mean (snapshots amortized)")]:
        # Both restore modes share the change phase only in their own run; take the median over all.
        v = median_of(runs, field)
        rows.append(f"| {label} | {_fmt(v)} | ≤ {TARGETS['w3_ratio']} | {_met(v, TARGETS['w3_ratio'], False)} |")
    for config in sorted({r["config"] for r in runs}):
        v = median_of(runs_of(results, "w3", None, config), "restore_fraction_of_disk")
        rows.append(f"| restore MB/s / disk read MB/s ({config}) | {_fmt(v)} | ≥ {TARGETS['w3_disk']} "
                    f"| {_met(v, TARGETS['w3_disk'], True)} |")
    for field in ("peak_rss_driver_mb", "peak_rss_executors_mb"):
        v = max((r[field] for r in runs if r.get(field) is not None), default=None)
        rows.append(f"| {field} (max over runs) | {_fmt(v, ' MB')} | reported | – |")
    return "\n".join(rows)


def latency_table(results: list[dict[str, Any]]) -> str:
    rows = ["| system | config | rate (events/s) | latency p50 ms | p99 ms | max ms | mean ms "
            "| from readable p50 / p99 ms | commits | events measured | load after |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(runs_of(results, "latency"), key=lambda r: (r["system"], r["config"], r["run"])):
        readable = (f"{_fmt(r.get('latency_from_readable_p50_ms'))} / {_fmt(r.get('latency_from_readable_p99_ms'))}"
                    if r.get("latency_from_readable_p50_ms") is not None else "–")
        rows.append(f"| {r['system']} | {r['config']} | {_fmt(r.get('rate'))} | {_fmt(r.get('latency_p50_ms'))} "
                    f"| {_fmt(r.get('latency_p99_ms'))} | {_fmt(r.get('latency_max_ms'))} "
                    f"| {_fmt(r.get('latency_mean_ms'))} | {readable} | {_fmt(r.get('commits'))} "
                    f"| {_fmt(r.get('events_measured'))} | {_fmt(r.get('loadavg_1m_after'))} |")
    return "\n".join(rows)


def _peak_fields(r: dict[str, Any]) -> list[str]:
    return sorted(k for k, v in r.items() if k.startswith("peak_") and k.endswith("_mb") and isinstance(v, (int, float)))


_PROCESS_NAMES = {"driver": "driver (Python)", "java": "JVM (Spark driver + executor)", "python": "Python processes",
                  "python3": "Python processes", "python3.11": "Python processes"}


def _by_process(runs: list[dict[str, Any]]) -> str:
    """The process breakdown of the run whose peak is the median one: which part of the
    tree holds the memory. Runs sampled before the driver was labelled count it among
    the Python processes."""
    sampled = sorted((r for r in runs if r.get("peak_rss_by_process") and r.get("peak_rss_mb")),
                     key=lambda r: r["peak_rss_mb"])
    if not sampled:
        return "–"
    parts = []
    for name, (count, mb) in sorted(sampled[len(sampled) // 2]["peak_rss_by_process"].items(),
                                    key=lambda kv: -kv[1][1]):
        label = _PROCESS_NAMES.get(name, name)
        parts.append(f"{label}{f' ×{count}' if count > 1 else ''}: {mb:,.0f}")
    return "; ".join(parts)


def memory_table(results: list[dict[str, Any]], sections: list[str]) -> str:
    rows = ["| section | system | config | peak memory, median over runs (MB) | by process at the peak (MB, median run) "
            "| field(s) |", "|---|---|---|---|---|---|"]
    for section in sections:
        keys = sorted({(r["system"], r["config"]) for r in runs_of(results, section)},
                      key=lambda k: (CONFIGS.index(k) if k in CONFIGS else 99, k))
        for system, config in keys:
            runs = runs_of(results, section, system, config)
            fields = sorted({f for r in runs for f in _peak_fields(r)})
            if not fields:
                rows.append(f"| {section} | {system} | {config} | not measured | – | – |")
                continue
            values = "; ".join(f"{f[5:-3]}: {_fmt(median_of(runs, f))}" for f in fields)
            rows.append(f"| {section} | {system} | {config} | {values} | {_by_process(runs)} | {', '.join(fields)} |")
    return "\n".join(rows)


# -- plots ----------------------------------------------------------------------------------------------

def draw_plots(results: list[dict[str, Any]], plots_dir: str) -> list[str]:
    """PNG files drawn (paths relative to plots_dir's parent); [] when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plots", file=sys.stderr)
        return []
    os.makedirs(plots_dir, exist_ok=True)
    colors = {"sparkpoint": "tab:blue", "spark-ss": "tab:orange", "pyflink": "tab:green"}
    drawn = []
    for section in THROUGHPUT_SECTIONS:
        keys = [k for k in CONFIGS if runs_of(results, section, *k)]
        if not keys:
            continue
        fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(keys)), 4.5))
        for i, (system, config) in enumerate(keys):
            values = [r["events_per_s"] for r in runs_of(results, section, system, config)]
            ax.bar(i, statistics.median(values), color=colors.get(system, "grey"), alpha=0.8)
            ax.scatter([i] * len(values), values, color="black", s=14, zorder=3)
        ax.set_xticks(range(len(keys)), [f"{s}\n{c}" for s, c in keys], fontsize=8)
        ax.set_ylabel("events/s after start-up (bar: median, dots: runs)")
        ax.set_title(SECTION_TITLES[section])
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v / 1e3:,.0f}k"))
        fig.tight_layout()
        name = f"throughput_{section}.png"
        fig.savefig(os.path.join(plots_dir, name), dpi=100)
        plt.close(fig)
        drawn.append(name)
    panels = []
    for section in THROUGHPUT_SECTIONS:
        keys = [k for k in CONFIGS if any(r.get("ckpt_p50_ms") is not None for r in runs_of(results, section, *k))
                and not k[1].endswith("off")]
        if keys:
            panels.append((section, keys))
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
        for ax, (section, keys) in zip(axes[0], panels):
            for i, k in enumerate(keys):
                runs = runs_of(results, section, *k)
                ax.bar(i - 0.2, median_of(runs, "ckpt_p50_ms") or 0, 0.4, color=colors.get(k[0], "grey"), alpha=0.6,
                       label="p50" if i == 0 else None)
                ax.bar(i + 0.2, median_of(runs, "ckpt_p99_ms") or 0, 0.4, color=colors.get(k[0], "grey"), alpha=1.0,
                       hatch="//", label="p99" if i == 0 else None)
            for q, color in (("p50", "grey"), ("p99", "red")):
                if section_targets(section)[q] is not None:
                    ax.axhline(section_targets(section)[q], color=color, ls="--", lw=1)
            ax.set_xticks(range(len(keys)), [f"{s}\n{c}" for s, c in keys], fontsize=8)
            ax.set_title(f"checkpoint duration, {section}")
            ax.set_ylabel("ms (median of runs)")
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(plots_dir, "checkpoint_ms.png"), dpi=100)
        plt.close(fig)
        drawn.append("checkpoint_ms.png")
    if runs_of(results, "nexmark"):
        import nexmark

        per_system = {system: nexmark.by_query(runs_of(results, "nexmark"), system) for system in nexmark.SYSTEMS}
        queries = sorted({q for rs in per_system.values() for q, r in rs.items() if r.get("events_per_s")},
                         key=lambda q: int(q[1:]))
        if queries:
            fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(queries)), 4.5))
            for i, system in enumerate(nexmark.SYSTEMS):
                values = [(per_system[system].get(q) or {}).get("events_per_s") or 0 for q in queries]
                ax.bar([j + (i - 1) * 0.27 for j in range(len(queries))], values, 0.27,
                       color=colors.get(system, "grey"), label=system)
            ax.set_yscale("log")
            ax.set_xticks(range(len(queries)), queries, fontsize=8)
            ax.set_ylabel("events/s after start-up (log; no bar: not run or cannot express)")
            ax.set_title("Nexmark, one query at a time")
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(os.path.join(plots_dir, "nexmark.png"), dpi=100)
            plt.close(fig)
            drawn.append("nexmark.png")
    lat = sorted(runs_of(results, "latency"), key=lambda r: (r["system"], r["run"]))
    if lat:
        fig, ax = plt.subplots(figsize=(max(5, 2 * len(lat)), 4.5))
        for i, r in enumerate(lat):
            c = colors.get(r["system"], "grey")
            ax.bar(i - 0.2, r.get("latency_p50_ms") or 0, 0.4, color=c, alpha=0.6, label="p50" if i == 0 else None)
            ax.bar(i + 0.2, r.get("latency_p99_ms") or 0, 0.4, color=c, hatch="//", label="p99" if i == 0 else None)
        ax.set_xticks(range(len(lat)), [f"{r['system']}\n{r['config']}\nrun {r['run']}" for r in lat], fontsize=8)
        ax.set_ylabel("event in → visible in committed output, ms")
        ax.set_title("end-to-end latency")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(plots_dir, "latency.png"), dpi=100)
        plt.close(fig)
        drawn.append("latency.png")
    return drawn


# -- RESULTS.md -----------------------------------------------------------------------------------------

def _docstring(script: str) -> str:
    path = os.path.join(HERE, script)
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return ast.get_docstring(ast.parse(f.read())) or ""


def _quoted_doc(script: str) -> str:
    doc = _docstring(script)
    return f"<details><summary>bench/{script} (its docstring)</summary>\n\n```\n{doc}\n```\n</details>" if doc else ""


def w1_settings(events: int | None, keys: int, epoch_records: int | None) -> str:
    ev = f"{events:,}" if events else "(see raw runs)"
    ep = f"{epoch_records:,}" if epoch_records else "(see raw runs)"
    return f"""- Events: N = {ev} (not the 20 M of BENCHMARKS.md, to keep each configuration short on a
  loaded 2-core machine), keys uniform over K = {keys:,}, value 0..999; the records of
  `GeneratorSource(seed=7, splits=2)`; per key `count(*)` and `sum(value)`, unwindowed, update mode.
- Batches: {ep} events per sparkpoint epoch (`max_records_per_epoch`, no rate limit);
  Spark SS reads the same events from Parquet files written from the same generator slices,
  one file per epoch, `maxFilesPerTrigger=1`, so batches are the same size.
- Both: `local[2]`, `spark.sql.shuffle.partitions=2`, AQE off, driver 2 GiB, output written as
  Parquet (sparkpoint: `ParquetSink`, two-phase commit; Spark SS: `foreachBatch` →
  `batch.write.parquet(.../batch=<id>)`).
- sparkpoint: in-process `JobMaster`, parallelism 2, `KeyedAggregate("w1", ["key"], "value",
  aggs=("count", "sum"), value_type="bigint")`, checkpoint storage a local directory;
  `execution.checkpointing.enabled=false` (ckpt-off) or `execution.checkpointing.interval=1 s`
  (ckpt-on, other checkpoint settings default: max-concurrent 1, incremental uploads).
  `ckpt-on` and `ckpt-off` read `GeneratorSource` (Spark computes each event: three `xxhash64`);
  `ckpt-on-parquet` reads the Spark SS peer's Parquet files with `FileSource(format="parquet",
  max_files_per_epoch=1)`: the same input path as Spark SS, for the like-for-like ratio.
  `ckpt-on-timed` is `ckpt-on` with `sparkpoint.epoch.target-duration=500 ms`: epochs are cut
  until one takes about 0.5 s (the epoch-size option a user picks for shorter checkpoints and
  output latency), with the same cap of {ep} events.
- CPU µs per event: CPU seconds (user + system) of the whole process tree (driver, JVM, Python
  workers; PyFlink: Python and the mini-cluster JVM) over the run, start-up included, per event.
  Every configuration keeps both cores busy, so this is what bounds its throughput.
- Spark SS: `groupBy("key").agg(count, sum)`, `outputMode("update")`,
  `trigger(processingTime="100 milliseconds")` (shorter than a batch: the query never waits);
  state store `RocksDBStateStoreProvider` with
  `spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled=true`, or the default
  `HDFSBackedStateStoreProvider`. Spark SS commits state every batch; its comparison point is
  sparkpoint with checkpoints on.
{PYFLINK_SETTINGS}
- events/s after start-up: events from the end of epoch/batch 0 to the end of the last epoch/batch
  with data, divided by that time (excludes Spark start-up and warm-up of batch 0, and sparkpoint's
  final empty epoch and final checkpoint; PyFlink: N / time from the last subtask RUNNING to the job
  FINISHED, from the JobManager log). Each round runs one fresh process per system with a
  discarded warm-up job first (`--warmup-events`, default 5 M: the JVMs still JIT-compile
  after 1 M), then each configuration once, alternating the order.
- Checkpoint p50/p99: sparkpoint's trigger-to-complete duration (`coordinator.stats`); bytes per
  checkpoint: uploaded bytes per completed checkpoint (incremental: only new SST files). Spark SS
  state commit: `stateOperators[0].commitTimeMs` per batch. PyFlink: `end_to_end_duration` and
  `checkpointed_size` from the REST API."""


PYFLINK_SETTINGS = """- PyFlink (Apache Flink through PyFlink, `bench/pyflink/w1_flink.py`, its own venv
  bench/.venv-pyflink; see bench/pyflink/README.md): Flink SQL with built-in functions only, parallelism 2,
  local mini-cluster; `execution.checkpointing.interval` 1 s (`*-ckpt`) or unset (`*-off`);
  `state.backend.type` hashmap or rocksdb (incremental); other settings Flink's defaults (exactly-once,
  max-concurrent 1, unaligned off). W1 reads `datagen` (random keys 0..K-1, same distribution, not the same
  events) into `SELECT key, COUNT(*), SUM(value) ... GROUP BY key` → blackhole; W2 reads
  `NumberSequenceSource` with computed key/value/event time (10,000 events per second of event time,
  up to 2 s disorder, watermark 5 s) into a 60 s `TUMBLE` window TVF → blackhole. Sinks are blackhole
  (no output written), unlike the Parquet output of the other two."""


def variant_settings(section: str, sample: dict[str, Any], events: int | None, keys: int) -> str:
    kind = W2_VARIANTS[section]
    slide_s, gap_s = (sample.get("slide_ms") or 0) // 1000, (sample.get("gap_ms") or 0) // 1000
    window = (f"60 s windows every {slide_s} s, count per window" if kind == "sliding"
              else f"sessions per key with a {gap_s} s gap, count per session")
    t = VARIANT_TARGETS
    return f"""### Settings
W2 with another window, as bench/w2_windows.py (below) says: {window}, final output
(one row per window once the watermark passes it). The rest as W2: N = {_fmt(events)} events,
K = {_fmt(keys)} keys, {_fmt(sample.get('event_time_per_s'))} events per second of event time, up to
2 s of disorder, watermark 5 s, the same epochs / Spark SS batches, Spark settings, round structure
and warm-up. sparkpoint: `bench/w2_window.py --window {kind}`; Spark SS: `bench/w2_spark_ss.py --window
{kind}` (the same Parquet events and sentinel as W2); both assert their committed rows equal the
count computed with numpy from the events. PyFlink: `bench/pyflink/w1_flink.py --workload
{section}`, W2's computed events at the same {_fmt(sample.get('event_time_per_s'))} events per second of
event time (W2's own PyFlink runs use 10,000), random keys (the same distribution, not the same
events), into a {'`HOP`' if kind == 'sliding' else '`SESSION` (PARTITION BY key)'} window TVF →
blackhole; `--check-output` counts its rows once. Targets: sparkpoint ckpt-on ≥ {t['faster_ss']}× Spark SS
with its faster store and ≥ {t['flink']}× PyFlink hashmap-ckpt, checkpoint p50 ≤ {t['p50']} ms.

{_quoted_doc("w2_windows.py")}"""


def section_markdown(section: str, results: list[dict[str, Any]], args: argparse.Namespace,
                     pyflink_status: dict[str, str], plots: list[str]) -> str:
    runs = runs_of(results, section)
    failed = [r for r in results if r.get("section") == section and "failed" in r]
    title = SECTION_TITLES[section]
    out = [f"## {title} (`{section}`)"]
    if not runs and not failed:
        return "\n".join(out + ["Not measured (no runs of this section in runs.jsonl)."])
    nrounds = len({r["run"] for r in runs})
    if section in THROUGHPUT_SECTIONS:
        sample = next((r for r in runs if r["system"] != "pyflink"), runs[0] if runs else {})
        keys = sample.get("keys", args.keys)
        events = next((r["events"] for r in runs if r["system"] == "sparkpoint"), None)
        if section == "w2":
            out.append("### Settings\nSame N, K, epoch size, Spark settings and round structure as W1; the pipeline "
                       "and the query as the scripts' docstrings say (below). Event time advances "
                       f"{sample.get('event_time_per_s', '?')} events per second of event time (sparkpoint, Spark SS)."
                       f" N = {_fmt(events)}, K = {_fmt(keys)}.\n" + PYFLINK_SETTINGS + "\n\n"
                       + _quoted_doc("w2_window.py") + "\n\n" + _quoted_doc("w2_spark_ss.py"))
        elif section in W2_VARIANTS:
            out.append(variant_settings(section, sample, events, keys))
        else:
            out.append("### Settings\n" + w1_settings(events, keys, sample.get("epoch_records")))
        if pyflink_status.get(section, "ok") != "ok":
            out.append(f"\n**PyFlink skipped:** {pyflink_status[section]}")
        out.append(f"\n### Results (median of {nrounds} rounds)\n" + throughput_table(results, section))
        out.append("\n### Ratios (throughput after start-up) and targets\n" + throughput_ratios(results, section))
        name = f"throughput_{section}.png"
        if name in plots:
            out.append(f"\n![{title}: events/s]({os.path.basename(args.plots_dir)}/{name})")
    elif section == "processor":
        out.append("### Settings\n" + _quoted_doc("processor_tws.py"))
        sample = runs[0] if runs else {}
        out.append(f"N = {_fmt(sample.get('events'))}, K = {_fmt(sample.get('keys'))}, "
                   f"{_fmt(sample.get('epoch_records'))} events per epoch / batch, event time advancing "
                   f"{_fmt(sample.get('event_time_per_s'))} events per second.")
        out.append(f"\n### Results (median of {nrounds} rounds)\n" + processor_table(results))
        out.append("\n### Ratio (throughput after start-up) and target\n" + processor_ratios(results))
    elif section == "nexmark":
        import nexmark

        sample = runs[0] if runs else {}
        out.append("### Settings\n" + _quoted_doc("nexmark.py") + "\n\n" + _quoted_doc("nexmark_spark_ss.py")
                   + "\n\n" + _quoted_doc("pyflink/nexmark_flink.py")
                   + f"\n\n{_fmt(sample.get('events_generated'))} generated events, "
                   f"{_fmt(sample.get('files_per_epoch'))} files of each stream per epoch / batch.")
        if pyflink_status.get(section, "ok") != "ok":
            out.append(f"\n**PyFlink skipped:** {pyflink_status[section]}")
        out.append(f"\n### Results per query ({nrounds} round(s); the median run of each)\n" + nexmark.table(runs))
        if "nexmark.png" in plots:
            out.append(f"\n![Nexmark: events/s per query]({os.path.basename(args.plots_dir)}/nexmark.png)")
    elif section == "w3":
        out.append("### Settings\n" + _quoted_doc("w3_large_state.py"))
        if runs:
            out.append(f"Keys: {_fmt(runs[0].get('keys'))}, change fraction {runs[0].get('change_fraction')}, "
                       f"checkpoint interval {runs[0].get('interval')}.")
        out.append(f"\n### Results ({nrounds} run(s); median, per-run values in brackets)\n" + w3_table(results))
        out.append("\n### W3 targets\n" + w3_targets(results))
    else:
        out.append("### Settings\n" + _quoted_doc("latency.py") + "\n" + _quoted_doc("latency_spark_rtm.py")
                   + "\n" + _quoted_doc("pyflink/latency_flink.py"))
        out.append(f"\n### Results ({nrounds} run(s) per system)\n" + latency_table(results))
        if "latency.png" in plots:
            out.append(f"\n![latency]({os.path.basename(args.plots_dir)}/latency.png)")
    if failed:
        out.append("\n**Failed runs:**\n" + "\n".join(
            f"- round {r.get('run')} {r.get('system')}: `{r['failed'].splitlines()[0][:200]}` … "
            f"`{r['failed'].strip().splitlines()[-1][:300]}`" for r in failed))
    return "\n".join(out)


def write_results_md(path: str, args: argparse.Namespace, records: list[dict[str, Any]],
                     plots: list[str], notes: str) -> None:
    sittings = [r for r in records if "sitting" in r and "env" in r]
    results = [r for r in records if "system" in r]
    present = [s for s in SECTIONS if any(r.get("section") == s for r in results)]
    pyflink_status: dict[str, str] = {}
    for s in sittings:
        for section in s.get("sections", []):
            pyflink_status[section] = s.get("pyflink", "ok")
    machine = []
    for s in sittings:
        env = s["env"]
        end = s.get("load_end")
        machine.append(
            f"- sitting {s['sitting']} (`{s.get('argv', '')}`; sections {', '.join(s.get('sections', [])) or 'none'}):\n"
            f"  date {env['date']}; nproc {env['nproc']}; RAM {env['ram_gib']} GiB; load average (1/5/15 min) at "
            f"start {' / '.join(f'{x:.2f}' for x in s['load_start'])}, at end "
            f"{' / '.join(f'{x:.2f}' for x in end) if end else '– (cut short)'}\n"
            f"  Python {env['python']}, pyspark {env['pyspark']}, pyarrow {env['pyarrow']}, "
            f"rocksdict {env['rocksdict']}, java `{env['java']}`, Flink (apache-flink) {env.get('flink') or '–'}"
            + (f"\n  PyFlink: {s['pyflink']}" if s.get("pyflink", "ok") != "ok" else ""))
    if any(r.get("sitting") is None for r in results):
        machine.append("- W1 runs from the older bench/w1_runs.jsonl (no sitting record: machine as at the time).")
    loads = "\n".join(f"  - {s}: {_load_range(runs_of(results, s))}" for s in present)
    cmd = "python bench/run_all.py " + " ".join(sys.argv[1:])
    sections_md = "\n\n".join(section_markdown(s, results, args, pyflink_status, plots) for s in SECTIONS)
    plot_dir = os.path.basename(args.plots_dir)
    links = "\n".join(f"- [{p}]({plot_dir}/{p})" for p in plots) or "- none drawn (matplotlib missing or no runs)"
    ck = f"\n![checkpoint durations]({plot_dir}/checkpoint_ms.png)" if "checkpoint_ms.png" in plots else ""
    raw = "\n".join(json.dumps({k: v for k, v in r.items() if k not in ("definitions", "peak_rss_by_process")})
                    for r in sorted(results, key=lambda r: (SECTIONS.index(r["section"]) if r.get("section") in SECTIONS
                                                            else 9, r["system"], r.get("config", ""), r.get("run", 0))))
    text = f"""# Benchmark results

Written by `{cmd}` (`make bench` runs it; re-running overwrites this file; `--more --runs 0` re-renders it and
the plots from {os.path.basename(args.raw)}). Sections: {', '.join(present) or 'none'}.

## Machine and versions
{chr(10).join(machine) or '- (no sitting recorded)'}
- load average (1 min) after each run, per section (range, median):
{loads}
- What else ran on the machine during a sitting is written in the hand-written observations below;
  absolute numbers drift from run to run on this 2-core machine, ratios measured side by side in one
  round hold better.

## Plots
{links}

{sections_md}

## Checkpoint durations (W1, W2)
sparkpoint and PyFlink checkpoint p50 / p99 per configuration are in each section's table; Spark SS
commits state every batch and reports no checkpoint duration (its state commit time is in the tables).{ck}

## Peak memory
Peak memory fields the RESULT lines carry (W2 and latency: PSS of the process tree, see
bench/process_tree.py; PyFlink: summed RSS of the Python process and its JVM; W3: driver and executor
side; W1: as W2). In local mode the Spark driver and executor are one JVM; Spark's Python workers
are the Python processes besides the driver (runs before 2026-11-24 18:45 UTC count the sparkpoint/PySpark driver
process, ~150 MB, among them).

{memory_table(results, present)}

{notes}

## Raw runs
```
{raw}
```
"""
    with open(path, "w") as f:
        f.write(text)


NOTES = """{observations}

## Flink (PyFlink)
{flink}"""


def _read_or(path: str, default: str) -> str:
    return open(path).read().strip() if os.path.exists(path) else default


# -- main -----------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"sections, of {','.join(SECTIONS)}")
    parser.add_argument("--runs", type=int, default=None,
                        help="rounds per section (default 3; w3 and latency: 1); 0 with --more: re-render only")
    parser.add_argument("--events", type=int, default=5_000_000, help="N of w1, w1-1m, w2")
    parser.add_argument("--keys", type=int, default=100_000, help="K of w1, w2, latency")
    parser.add_argument("--keys-1m", type=int, default=1_000_000, help="K of w1-1m")
    parser.add_argument("--epoch-records", type=int, default=500_000)
    parser.add_argument("--big-epoch-records", type=int, default=1_000_000, help="epoch size of w1-e1m")
    # Every system's JVM is still JIT-compiling after a 1 M-event warm-up (sparkpoint's run of 5 M
    # events: 4,300 compilations after 1 M of warm-up, 2,300 after 6 M, 1,600 after 11 M); a
    # streaming job runs long past that, so each script warms its JVM with 5 M events first.
    parser.add_argument("--warmup-events", type=int, default=5_000_000,
                        help="passed to the w1/w2 scripts: a discarded run first, in the same process")
    parser.add_argument("--w3-keys", type=int, default=10_000_000)
    parser.add_argument("--w3-restore-modes", default="local,remote")
    parser.add_argument("--latency-rate", type=int, default=50_000)
    parser.add_argument("--latency-duration-s", type=float, default=60)
    parser.add_argument("--latency-warmup-s", type=float, default=None, help="passed to latency.py (its default: 10)")
    parser.add_argument("--processor-events", type=int, default=2_000_000, help="N of processor")
    parser.add_argument("--processor-keys", type=int, default=10_000, help="K of processor")
    parser.add_argument("--processor-epoch-records", type=int, default=100_000)
    parser.add_argument("--processor-warmup-events", type=int, default=None,
                        help="passed to processor_tws.py (its default: 200,000)")
    parser.add_argument("--nexmark-events", type=int, default=10_000_000, help="events generated for nexmark")
    parser.add_argument("--nexmark-queries", default=None, help="default: every examples/nexmark query")
    parser.add_argument("--nexmark-files-per-stream", type=int, default=20)
    parser.add_argument("--nexmark-files-per-epoch", type=int, default=2)
    parser.add_argument("--work", default="/tmp/sparkpoint-bench")
    parser.add_argument("--results-dir", default=HERE,
                        help="where RESULTS.md, runs.jsonl and plots/ go (default: bench/)")
    parser.add_argument("--no-pyflink", action="store_true", help="skip the PyFlink peer")
    parser.add_argument("--more", action="store_true",
                        help="keep the runs in runs.jsonl and add --runs rounds; --more --runs 0 only rewrites "
                             "RESULTS.md and the plots from them")
    args = parser.parse_args()
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; known: {SECTIONS}")
    os.makedirs(args.results_dir, exist_ok=True)
    args.raw = os.path.join(args.results_dir, "runs.jsonl")
    args.plots_dir = os.path.join(args.results_dir, "plots")
    results_md = os.path.join(args.results_dir, "RESULTS.md")

    records = read_raw(args.raw)
    render_only = args.more and args.runs == 0
    if not render_only:
        if args.more:
            for section in sections:
                check_same_settings(records, section, args)
        else:
            records = [r for r in records if not (r.get("section") in sections and "system" in r)]
        pyflink_python, pyflink_status = None, "skipped (--no-pyflink)" if args.no_pyflink else "ok"
        if not args.no_pyflink and any(s in THROUGHPUT_SECTIONS or s in ("nexmark", "latency") for s in sections):
            print("bash bench/pyflink/setup.sh ...", flush=True)
            pyflink_python, pyflink_status = setup_pyflink()
            print(f"PyFlink: {pyflink_status}", flush=True)
        sitting_id = max((r["sitting"] for r in records if isinstance(r.get("sitting"), int) and "env" in r),
                         default=-1) + 1
        sitting = {"sitting": sitting_id, "env": environment(pyflink_python), "load_start": list(os.getloadavg()),
                   "load_end": None, "argv": "python bench/run_all.py " + " ".join(sys.argv[1:]),
                   "sections": sections, "pyflink": pyflink_status}
        records.append(sitting)
        write_raw(args.raw, records)

        def record(section: str, got: list[dict[str, Any]]) -> None:
            for r in got:
                r["section"], r["sitting"] = section, sitting_id
            records.extend(got)
            write_raw(args.raw, records)  # after every script, so a cut-short sitting keeps what it measured

        def failed(section: str, system: str, run: int, err: Exception) -> None:
            print(f"  FAILED: {err}", flush=True)
            record(section, [{"system": system, "config": "-", "run": run, "failed": str(err)}])

        for section in sections:
            nruns = args.runs if args.runs is not None else (1 if section in ONE_ROUND_SECTIONS else 3)
            first = max((r["run"] for r in records if r.get("section") == section and "run" in r), default=-1) + 1
            started_section = time.monotonic()
            for run in range(first, first + nruns):
                if section in THROUGHPUT_SECTIONS:
                    jobs = throughput_jobs(section, args, run, pyflink_python)
                elif section == "w3":
                    jobs = [("sparkpoint", w3_command(args, run))]
                elif section == "processor":
                    jobs = processor_jobs(args, run)
                elif section == "nexmark":
                    jobs = nexmark_jobs(args, run, pyflink_python)
                else:
                    jobs = latency_jobs(args, pyflink_python)
                for system, cmd in jobs:
                    started = time.monotonic()
                    print(f"[{section}] round {run} {system}: {' '.join(os.path.relpath(c, REPO) if c.startswith(REPO + os.sep) else c for c in cmd)}",
                          flush=True)
                    try:
                        got = run_command(f"{os.path.basename(cmd[1])} ({section}, round {run})", cmd)
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        failed(section, system, run, e)
                        continue
                    for r in got:
                        r["run"] = run if section in ("latency", "nexmark") else r["run"]
                        value = r.get("events_per_s") or r.get("latency_p50_ms") or r.get("ratio_uploaded_to_changed")
                        print(f"  {r['system']:10s} {r['config']:14s} {_fmt(value):>12s} "
                              f"(load {r.get('loadavg_1m_after') or 0:.1f})", flush=True)
                    record(section, got)
                    print(f"  {time.monotonic() - started:.0f} s", flush=True)
            print(f"[{section}] {time.monotonic() - started_section:.0f} s in all", flush=True)
        sitting["load_end"] = list(os.getloadavg())
        write_raw(args.raw, records)

    if not any(r.get("section") == "w1" for r in records):
        legacy = read_raw(os.path.join(args.results_dir, "w1_runs.jsonl"))
        records += [dict(r, section="w1", sitting=None) for r in legacy]
    plots = draw_plots([r for r in records if "system" in r], args.plots_dir)
    flink = _read_or(os.path.join(HERE, "flink_note.md"), "Not written.")
    observations = _read_or(os.path.join(HERE, "observations.md"), "")
    write_results_md(results_md, args, records, plots, NOTES.format(flink=flink, observations=observations))
    print(f"wrote {results_md} and {len(plots)} plot(s) under {args.plots_dir}")
    results = [r for r in records if "system" in r]
    for section in THROUGHPUT_SECTIONS:
        if runs_of(results, section):
            print(f"\n{section}\n" + throughput_table(results, section) + "\n" + throughput_ratios(results, section))
    if runs_of(results, "processor"):
        print("\nprocessor\n" + processor_table(results) + "\n" + processor_ratios(results))
    if runs_of(results, "nexmark"):
        import nexmark

        print("\nnexmark\n" + nexmark.table(runs_of(results, "nexmark")))


if __name__ == "__main__":
    main()
