"""W1 (keyed aggregate) and W2 (60 s tumbling window) on Apache Flink via PyFlink (Flink SQL,
built-in functions only), parallelism 2, local mini-cluster, as a peer of sparkpoint; and
W2's variants w2-sliding (60 s windows every 10 s, HOP) and w2-session (30 s gap, SESSION).

    bash bench/pyflink/setup.sh        # once: its own virtualenv at bench/.venv-pyflink
    bench/.venv-pyflink/bin/python bench/pyflink/w1_flink.py [--workload w1|w2|w2-sliding|w2-session]
        [--events 5000000] [--keys 100000] [--configs hashmap-ckpt,hashmap-off,rocksdb-ckpt]
        [--runs 1] [--first-run 0] [--warmup-events 1000000] [--work /tmp/sparkpoint-bench]
        [--event-time-per-s 10000] [--slide-s 10] [--gap-s 30]

Prints one JSON line per run (prefixed `RESULT `), field names as bench/w1_keyed_aggregate.py
where they mean the same. events/s after start-up: events / (job FINISHED - all subtasks
RUNNING), both read from the JobManager log of this process's mini-cluster (ms precision);
with checkpoints on this span includes Flink's wait for the final checkpoint after the end of
input (at most one interval plus one checkpoint). Checkpoint statistics: the REST API
(`/jobs/<id>/checkpoints`) polled while the job runs (the mini-cluster and its REST API go away
when the job ends), completed by the log's "Completed checkpoint" lines for the checkpoints that
ended after the last poll. Peak RSS: the Python process and all its descendants (the JVM), summed,
sampled every 0.2 s while the run's job runs.

Must run with the PyFlink virtualenv's python (apache-flink 2.x), not the project's venv.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from process_tree import tree_cpu_s  # noqa: E402 (bench/: standard library only, usable in this venv)

KNOWN_BACKENDS = ("hashmap", "rocksdb")
CKPT_INTERVAL = "1 s"
# The project's GeneratorSource: 10,000 events per second of event time for the whole job, up to
# 2 s of disorder, starting at 1,700,000,000,000 ms (sparkpoint/connectors/generator.py).
# run_all.py passes the 5,000 of bench/w2_workload.py for the W2 variants.
START_TS_MS = 1_700_000_000_000
EVENT_TIME_PER_S = 10_000
DISORDER_MS = 2_000
# The variants' windows: bench/w2_windows.py (its defaults, and why these sizes).
W2_WORKLOADS = ("w2", "w2-sliding", "w2-session")


@dataclass(frozen=True)
class W2Shape:
    """Event-time density and the variants' window sizes (bench/w2_windows.py's defaults)."""
    event_time_per_s: int = EVENT_TIME_PER_S
    slide_s: int = 10
    gap_s: int = 30

    def fields(self, workload: str) -> dict[str, Any]:
        out: dict[str, Any] = {"event_time_per_s": self.event_time_per_s}
        if workload == "w2-sliding":
            out.update(window="sliding", window_ms=60_000, slide_ms=self.slide_s * 1000)
        elif workload == "w2-session":
            out.update(window="session", window_ms=None, gap_ms=self.gap_s * 1000)
        else:
            out.update(window="tumbling", window_ms=60_000)
        return out

# Triggers that fail before all subtasks run, or race with tasks finishing at the end of input
# (Flink re-triggers at once when one is declined because a task is closing): not storage failures.
BENIGN_FAILURES = ("tasks not all running yet (start-up)", "a task just finished (end of input)")
LOG_TS = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


# ---------------------------------------------------------------- environment (before pyflink)

def prepare_flink_home(work: str) -> dict[str, str]:
    """A copy of the package's conf/ with java.io.tmpdir and the REST address moved, and the
    log directory under `work`. Must run before the first TableEnvironment (that starts the JVM)."""
    import pyflink
    from ruamel.yaml import YAML

    conf, logs, tmp = (os.path.join(work, d) for d in ("conf", "log", "tmp"))
    shutil.rmtree(conf, ignore_errors=True)
    shutil.rmtree(logs, ignore_errors=True)
    os.makedirs(logs)
    os.makedirs(tmp, exist_ok=True)
    shutil.copytree(os.path.join(os.path.dirname(pyflink.__file__), "conf"), conf)
    yaml = YAML()
    path = os.path.join(conf, "config.yaml")
    with open(path) as f:
        cfg = yaml.load(f)
    opts = cfg.setdefault("env", {}).setdefault("java", {}).setdefault("opts", {})
    opts["all"] = (str(opts.get("all") or "") + f" -Djava.io.tmpdir={tmp}").strip()
    cfg["rest"] = {"address": "127.0.0.1", "bind-address": "127.0.0.1"}
    with open(path, "w") as f:
        yaml.dump(cfg, f)
    os.environ["FLINK_CONF_DIR"] = conf
    os.environ["FLINK_LOG_DIR"] = logs
    return {"conf": conf, "log": logs, "tmp": tmp}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- peak RSS of the process tree

def tree_rss_bytes(root: int) -> int:
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/statm") as f:
                pages = int(f.read().split()[1])
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        parents[int(name)] = int(fields[1])
        rss[int(name)] = pages * page
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(p for p, pp in parents.items() if pp == pid)
    return total


class RssSampler(threading.Thread):
    def __init__(self, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.interval, self.peak, self._stop_flag = interval, 0, threading.Event()

    def run(self) -> None:
        while not self._stop_flag.is_set():
            self.peak = max(self.peak, tree_rss_bytes(os.getpid()))
            self._stop_flag.wait(self.interval)

    def stop(self) -> int:
        self._stop_flag.set()
        self.join()
        return self.peak


# ---------------------------------------------------------------- the job

def parse_config(name: str) -> tuple[str, bool]:
    backend, _, mode = name.partition("-")
    if backend not in KNOWN_BACKENDS or mode not in ("ckpt", "off"):
        raise SystemExit(f"unknown config {name!r}: use <hashmap|rocksdb>-<ckpt|off>")
    return backend, mode == "ckpt"


def table_env(backend: str, ckpt: bool, root: str, rest_port: int):
    settings = {
        "parallelism.default": "2",
        "rest.port": str(rest_port),
        "rest.address": "127.0.0.1",
        "rest.bind-address": "127.0.0.1",
        "state.backend.type": backend,
        "execution.checkpointing.dir": "file://" + os.path.abspath(os.path.join(root, "checkpoints")),
        "web.checkpoints.history": "50",
    }
    if ckpt:
        settings["execution.checkpointing.interval"] = CKPT_INTERVAL
    if backend == "rocksdb":
        settings["execution.checkpointing.incremental"] = "true"
        settings["state.backend.rocksdb.localdir"] = os.path.abspath(os.path.join(root, "rocksdb"))
    return (*environments(settings), settings)


def environments(settings: dict[str, str]):
    """A streaming execution environment and its table environment, both with `settings`."""
    from pyflink.common import Configuration
    from pyflink.datastream import StreamExecutionEnvironment
    from pyflink.table import EnvironmentSettings, StreamTableEnvironment

    conf = Configuration()
    for k, v in settings.items():
        conf.set_string(k, v)
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    t_env = StreamTableEnvironment.create(env, EnvironmentSettings.new_instance().in_streaming_mode()
                                          .with_configuration(conf).build())
    return env, t_env


def window_tvf(workload: str, shape: W2Shape) -> str:
    """The window table-valued function of a W2 workload over `events`."""
    if workload == "w2-sliding":
        return f"HOP(TABLE events, DESCRIPTOR(ts), INTERVAL '{shape.slide_s}' SECOND, INTERVAL '60' SECOND)"
    if workload == "w2-session":
        return f"SESSION(TABLE events PARTITION BY key, DESCRIPTOR(ts), INTERVAL '{shape.gap_s}' SECOND)"
    return "TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '60' SECOND)"


def create_tables(env, t_env, workload: str, events: int, keys: int, shape: W2Shape = W2Shape()) -> str:
    """Defines `events` and `sink`; returns the INSERT statement of the workload.

    W1: Flink's `datagen` connector: key uniform over K, value 0..999, ts random (unused).
    W2: event time must advance steadily with the event count, as GeneratorSource's does
    (ts = 1,700,000,000,000 + g * 1000 / 10,000 - jitter, jitter 0..1999 ms, g the global
    event number interleaved over the splits). datagen's `sequence` kind cannot be used: its
    SequenceGenerator materialises all remaining values and writes them into every
    checkpoint. So W2 reads `NumberSequenceSource(0, N-1)` ( one contiguous
    range per subtask, the position is its only state) and computes key, value and ts in SQL
    with built-in functions; g interleaves the two subtask ranges like GeneratorSource's splits.
    w2-sliding and w2-session read the same events (at `shape.event_time_per_s`) into a HOP or
    SESSION window TVF instead of TUMBLE."""
    if workload == "w1":
        t_env.execute_sql(f"""
            CREATE TABLE events (key BIGINT, `value` BIGINT, ts TIMESTAMP_LTZ(3)) WITH (
                'connector' = 'datagen',
                'number-of-rows' = '{events}',
                'rows-per-second' = '1000000000',
                'fields.key.kind' = 'random', 'fields.key.min' = '0', 'fields.key.max' = '{keys - 1}',
                'fields.value.kind' = 'random', 'fields.value.min' = '0', 'fields.value.max' = '999',
                'fields.ts.kind' = 'random', 'fields.ts.max-past' = '{DISORDER_MS}'
            )""")
        t_env.execute_sql("CREATE TABLE sink (key BIGINT, cnt BIGINT, total BIGINT) WITH ('connector' = 'blackhole')")
        return "INSERT INTO sink SELECT key, COUNT(*), SUM(`value`) FROM events GROUP BY key"
    from pyflink.table import Schema

    half = events // 2
    g = f"(CASE WHEN f0 < {half} THEN 2 * f0 ELSE 2 * (f0 - {half}) + 1 END)"
    jitter = f"MOD(f0 * 2654435761, {DISORDER_MS})"  # deterministic, spread over 0..1999 (no overflow below 3e9 events)
    schema = (Schema.new_builder()
              .column("f0", "BIGINT")
              .column_by_expression("key", f"CAST(RAND_INTEGER({keys}) AS BIGINT)")
              .column_by_expression("value", "CAST(RAND_INTEGER(1000) AS BIGINT)")
              .column_by_expression("ts", f"TO_TIMESTAMP_LTZ({START_TS_MS} + {g} * 1000 / {shape.event_time_per_s} - {jitter}, 3)")
              .watermark("ts", "ts - INTERVAL '5' SECOND")
              .build())
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource

    seq = env.from_source(NumberSequenceSource(0, events - 1), WatermarkStrategy.no_watermarks(), "sequence",
                          Types.LONG())
    t_env.create_temporary_view("events", t_env.from_data_stream(seq, schema))
    t_env.execute_sql("CREATE TABLE sink (key BIGINT, window_start TIMESTAMP(3), cnt BIGINT) "
                      "WITH ('connector' = 'blackhole')")
    return (f"INSERT INTO sink SELECT key, window_start, COUNT(*) FROM TABLE({window_tvf(workload, shape)}) "
            "GROUP BY key, window_start, window_end")


_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an http_proxy


def rest_get(port: int, path: str) -> Any:
    with _LOCAL.open(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
        return json.load(r)


def poll_job(port: int, job_id: str, job_client) -> dict[str, Any]:
    """Poll the job and its checkpoints until the job ends; keep every checkpoint seen."""
    seen: dict[int, dict[str, Any]] = {}
    last_job: dict[str, Any] = {}
    last_counts: dict[str, Any] = {}
    polls = errors = 0
    while True:
        try:
            last_job = rest_get(port, f"/jobs/{job_id}")
            ck = rest_get(port, f"/jobs/{job_id}/checkpoints")
            polls += 1
            last_counts = ck.get("counts", last_counts)
            for c in ck.get("history", []):
                if c.get("status") in ("COMPLETED", "FAILED"):
                    seen[c["id"]] = c
            if last_job.get("state") in ("FINISHED", "FAILED", "CANCELED"):
                break
        except Exception as e:  # noqa: BLE001 — not up yet, or already gone with the mini-cluster
            errors += 1
            if os.environ.get("W1_FLINK_DEBUG"):
                print(f"poll {polls}/{errors}: {e!r}"[:300], flush=True)
            if polls:  # the REST API answered before: has the job (and its mini-cluster) ended?
                try:
                    status = str(job_client.get_job_status().result())
                except Exception:  # noqa: BLE001 — "MiniCluster ... has already been shut down"
                    break
                if any(s in status for s in ("FINISHED", "FAILED", "CANCELED")):
                    break
            if errors > 600:
                raise
        time.sleep(0.2)
    return {"checkpoints": seen, "job": last_job, "counts": last_counts, "polls": polls}


def read_log(log_dir: str, offset_by_file: dict[str, int]) -> list[str]:
    lines: list[str] = []
    for name in sorted(os.listdir(log_dir)):
        if name.endswith(".log"):
            with open(os.path.join(log_dir, name), errors="replace") as f:
                f.seek(offset_by_file.get(name, 0))
                lines += f.read().splitlines()
    return lines


def log_offsets(log_dir: str) -> dict[str, int]:
    return {n: os.path.getsize(os.path.join(log_dir, n)) for n in os.listdir(log_dir) if n.endswith(".log")}


def log_time(line: str) -> float | None:
    m = LOG_TS.match(line)
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


def parse_job_log(lines: list[str], job_id: str) -> dict[str, Any]:
    """Task and job state changes, and checkpoints, of one job from the JobManager log."""
    running: list[float] = []
    source_finished: list[float] = []
    job_running = job_finished = None
    completed: dict[int, dict[str, Any]] = {}
    failures: dict[str, int] = {}
    for n, line in enumerate(lines):
        t = log_time(line)
        if t is None:
            continue
        if "ExecutionGraph" in line and "switched from INITIALIZING to RUNNING" in line:
            running.append(t)
        elif "ExecutionGraph" in line and "switched from RUNNING to FINISHED" in line and "Source:" in line:
            source_finished.append(t)
        elif f"({job_id}) switched from state CREATED to RUNNING" in line and "ExecutionGraph" in line:
            job_running = t
        elif f"({job_id}) switched from state RUNNING to FINISHED" in line and "ExecutionGraph" in line:
            job_finished = t
        elif "Completed checkpoint" in line and job_id in line:
            m = re.search(r"Completed checkpoint (\d+) for job \S+ \((\d+) bytes, checkpointDuration=(\d+) ms", line)
            if m:
                completed[int(m.group(1))] = {"bytes": int(m.group(2)), "duration_ms": int(m.group(3))}
        elif "CheckpointFailureManager" in line and job_id in line and "Failed to trigger" in line:
            # The reason is on the line itself or on the exception line after it.
            text = line + " " + (lines[n + 1] if n + 1 < len(lines) else "")
            if "Not all required tasks are currently running" in text or "is not being executed" in text:
                reason = BENIGN_FAILURES[0]
            elif "unknown task" in text or "task is closing" in text or "is suspending" in text or "FINISHED" in text:
                reason = BENIGN_FAILURES[1]
            else:
                m = re.search(r"Failure reason: ([^.]*)", text)
                reason = m.group(1) if m else "other"
            failures[reason] = failures.get(reason, 0) + 1
    return {"all_running": max(running) if running else None, "job_running": job_running,
            "job_finished": job_finished, "source_finished": source_finished,
            "completed": completed, "failures": failures}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))
    return float(s[k])


def run_once(workload: str, config: str, events: int, keys: int, work: str, run: int,
             log_dir: str, shape: W2Shape = W2Shape()) -> dict[str, Any]:
    backend, ckpt = parse_config(config)
    root = os.path.join(work, f"{workload}-{config}-{run}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    port = free_port()
    env, t_env, settings = table_env(backend, ckpt, root, port)
    insert = create_tables(env, t_env, workload, events, keys, shape)
    offsets = log_offsets(log_dir)
    sampler = RssSampler()
    sampler.start()
    started, cpu0 = time.monotonic(), tree_cpu_s(os.getpid())
    result = t_env.execute_sql(insert)
    job_client = result.get_job_client()
    job_id = str(job_client.get_job_id())
    polled = poll_job(port, job_id, job_client)
    job_client.get_job_execution_result().result()
    wall, cpu = time.monotonic() - started, tree_cpu_s(os.getpid()) - cpu0
    peak = sampler.stop()
    time.sleep(0.3)  # let the log flush the job's last lines
    log = parse_job_log(read_log(log_dir, offsets), job_id)
    if log["all_running"] is None or log["job_finished"] is None:
        raise RuntimeError(f"job {job_id}: no RUNNING/FINISHED times in the log under {log_dir}")
    run_s = log["job_finished"] - log["all_running"]
    # Checkpoints: REST first (its incremental checkpointed_size), the log for those after the last poll.
    rest_ck = polled["checkpoints"]
    completed = {i: c for i, c in rest_ck.items() if c["status"] == "COMPLETED"}
    durations = {i: c["end_to_end_duration"] for i, c in completed.items()}
    for i, c in log["completed"].items():
        durations.setdefault(i, c["duration_ms"])
    sizes = [c["checkpointed_size"] for c in completed.values()]
    full_sizes = [c["state_size"] for c in completed.values()]
    rest_failed = int(polled["counts"].get("failed", 0))
    log_failed = sum(log["failures"].values())
    d = list(durations.values())
    sources_done = max(log["source_finished"]) - log["all_running"] if log["source_finished"] else None
    out = {
        "system": "pyflink", "config": config, "workload": workload, "run": run,
        "events": events, "keys": keys, **(shape.fields(workload) if workload in W2_WORKLOADS else {}),
        "events_per_s": events / run_s,
        "wall_s": wall, "events_per_s_incl_startup": events / wall,
        # CPU of the process tree (Python, the mini-cluster JVM) over the whole job, start-up included.
        "cpu_s": cpu, "cpu_us_per_event": 1e6 * cpu / events,
        "run_s": run_s, "sources_finished_s": sources_done,
        "startup_s": log["all_running"] - (log["job_running"] or log["all_running"]),
        "checkpoints_completed": len(durations) if ckpt else 0,
        "checkpoints_failed": max(rest_failed, log_failed),
        "ckpt_failures_by_reason": log["failures"],
        "checkpoints_failed_mid_run": sum(v for k, v in log["failures"].items() if k not in BENIGN_FAILURES),
        "ckpt_p50_ms": percentile(d, 50), "ckpt_p99_ms": percentile(d, 99),
        "ckpt_bytes_median": statistics.median(sizes) if sizes else None,
        "ckpt_bytes_max": max(sizes) if sizes else None,
        "ckpt_state_bytes_median": statistics.median(full_sizes) if full_sizes else None,
        "ckpt_stats_from_rest": len(completed),
        "peak_rss_mb": peak / 2**20,
        "state_backend": backend, "checkpoint_interval": CKPT_INTERVAL if ckpt else None,
        "incremental": backend == "rocksdb", "parallelism": 2,
        "status": "FINISHED",  # a job that did not finish raised above
        "flink_version": flink_version(),
    }
    shutil.rmtree(root, ignore_errors=True)
    return out


def check_output(workload: str, config: str, events: int, keys: int, work: str, shape: W2Shape) -> dict[str, Any]:
    """The number of rows the workload's query emits, written as CSV files instead of to the
    blackhole, then counted (collecting them through py4j costs minutes per 100 k rows). Keys
    are random here, so the count matches sparkpoint's and Spark SS's only closely, not exactly."""
    backend, ckpt = parse_config(config)
    root = os.path.join(work, f"check-{workload}")
    out = os.path.join(root, "rows")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    env, t_env, _ = table_env(backend, ckpt, root, free_port())
    select = create_tables(env, t_env, workload, events, keys, shape).split(" ", 3)[3]  # drop "INSERT INTO sink"
    t_env.execute_sql(f"CREATE TABLE checked (key BIGINT, window_start TIMESTAMP(3), cnt BIGINT) WITH "
                      f"('connector' = 'filesystem', 'path' = 'file://{os.path.abspath(out)}', 'format' = 'csv')")
    t_env.execute_sql("INSERT INTO checked " + select).wait()
    n = 0
    for d, _, files in os.walk(out):
        for name in files:
            if not name.startswith("."):  # in-progress and checksum files are hidden
                with open(os.path.join(d, name)) as f:
                    n += sum(1 for _ in f)
    return {"workload": workload, "events": events, "keys": keys, **shape.fields(workload), "output_rows": n}


def flink_version() -> str:
    from importlib.metadata import version

    return version("apache-flink")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=("w1", *W2_WORKLOADS), default="w1")
    p.add_argument("--events", type=int, default=5_000_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--configs", default="hashmap-ckpt,hashmap-off,rocksdb-ckpt",
                   help="comma-separated <hashmap|rocksdb>-<ckpt|off>; ckpt = checkpoints every 1 s")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--first-run", type=int, default=0, help="run number of the first run (labels only)")
    p.add_argument("--warmup-events", type=int, default=1_000_000,
                   help="a discarded job first (first config), so the JVM is warm for every configuration; 0: none")
    p.add_argument("--work", default="/tmp/sparkpoint-bench",
                   help="the run's files go to <work>/pyflink-<pid> (removed at the end unless W1_FLINK_KEEP is set)")
    p.add_argument("--epoch-records", type=int, default=None, help="accepted and ignored (run_all.py passes it)")
    p.add_argument("--event-time-per-s", type=int, default=EVENT_TIME_PER_S,
                   help="W2 workloads: events per second of event time (run_all.py passes 5000 for the variants)")
    p.add_argument("--slide-s", type=int, default=W2Shape.slide_s, help="w2-sliding: windows of 60 s every this")
    p.add_argument("--gap-s", type=int, default=W2Shape.gap_s, help="w2-session: the session gap")
    p.add_argument("--check-output", action="store_true",
                   help="measure nothing: run the workload's query once (first config), collect its rows and print "
                        "`CHECK {...}` with their number, to check the query against the other systems' counts")
    args = p.parse_args()
    shape = W2Shape(args.event_time_per_s, args.slide_s, args.gap_s)
    configs = args.configs.split(",")
    for c in configs:
        parse_config(c)
    # One directory per process (conf copy, JVM tmpdir, log, checkpoints): concurrent runs do not
    # clash. Removed after a clean exit; kept (with the JobManager log) when a run failed.
    work = os.path.join(os.path.abspath(args.work), f"pyflink-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    dirs = prepare_flink_home(work)
    if args.check_output:
        print("CHECK " + json.dumps(check_output(args.workload, configs[0], args.events, args.keys, work, shape)),
              flush=True)
        return
    if args.warmup_events:
        run_once(args.workload, configs[0], args.warmup_events, args.keys, work, -1, dirs["log"], shape)
    for run in range(args.first_run, args.first_run + args.runs):
        # Alternate the order run by run so drift in the machine's load hits every config alike.
        for config in (configs if run % 2 == 0 else configs[::-1]):
            result = run_once(args.workload, config, args.events, args.keys, work, run, dirs["log"], shape)
            result["loadavg_1m_after"] = os.getloadavg()[0]
            print("RESULT " + json.dumps(result), flush=True)
    if not os.environ.get("W1_FLINK_KEEP"):
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
