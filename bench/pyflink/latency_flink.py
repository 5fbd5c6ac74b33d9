"""End-to-end latency at a steady input rate on Apache Flink via PyFlink: event in → visible in
exactly-once committed output, p50/p99 per event; the PyFlink peer of bench/latency.py, on the same
W1-shaped keyed aggregate (count + sum per key over K keys), parallelism 2, hashmap state backend,
checkpoints every 1 s, local mini-cluster.

    bash bench/pyflink/setup.sh        # once: its own virtualenv at bench/.venv-pyflink
    bench/.venv-pyflink/bin/python bench/pyflink/latency_flink.py [--rate 50000] [--duration-s 60]
        [--keys 100000] [--skip-s 5] [--warmup-s 10] [--work /tmp/sparkpoint-bench]

A discarded warm-up job of --warmup-s first (same JVM), then the measured job of --duration-s.

Source, steady: Flink's FLIP-27 `DataGeneratorSource` (two splits, one per subtask) emitting
rate × duration events, then ending, whose generator function is a small Java class (compiled
with `javac` into the work directory at start; no Python UDF in the job) that paces each subtask
to rate / 2 events per second: its k-th event is due at start + k / (rate / 2), and the function
waits while it is more than 1 ms ahead of that schedule. The SQL `datagen` connector is not used:
in Flink 2.3 it is still the legacy `DataGeneratorSource` SourceFunction, which emits each
second's rate / 2 rows per subtask in one burst at the start of the second, then sleeps. Flink's
`RateLimiterStrategy.perSecond` (a Guava limiter acquired per record) was tried first: on this
2-core machine under a load average of 15-18 the source reached 21-26k events/s at --rate 50000
with it and with the pacing function alike: the job, not the limiter, held the source back.
Event-in time: the event's due time on the steady schedule (the subtask's first event's wall
clock + k / (rate / 2)): the ideal arrival, as bench/latency.py's T0 + g / rate for sparkpoint.
An event is generated up to 1 ms before it is due, or later when the job holds the source back;
that wait is part of the latency measured. Its generation wall clock travels with it too:
`source_behind_p99_ms` / `source_behind_max_ms` (generation − arrival) and `source_rate`
(events / span of generation times) say whether the source kept the rate.
Key = RAND_INTEGER(K), value = RAND_INTEGER(1000), computed columns in SQL (uniform, like the
W1 peer; not the generator's exact events).

Query: `SELECT key, COUNT(*), SUM(value), MAX(arrival), LAST_VALUE(arrival),
LAST_VALUE(generated) FROM events GROUP BY key` (no mini-batch: Flink emits one update per input
event, so each +I/+U row is one event and LAST_VALUE(arrival) is that event's arrival; the script
checks that the committed output holds exactly one +I/+U row per event). Its changelog
(`to_changelog_stream`) goes straight into a DataStream `FileSink` (row format, `Row.toString`
lines such as `+U[7, 3, 1500, t, t, t']`, on-checkpoint rolling policy): its part files are in
progress (hidden, `.part-*.inprogress.*`) until the checkpoint covering them completes, then
renamed to their final name: exactly-once output, visible when the checkpoint commits. The
changelog is taken in upsert mode (the group key as primary key): +I/+U rows only, as Flink's
upsert sinks take it (a -U row would be skipped).

Visible-in-committed-output time: a watcher thread in this script lists the output directory
every 10 ms and records when each finished part file first appears.
Latency per event = the first-seen time of the file holding the first output row (in order of
visibility) of the event's key whose MAX(arrival) ≥ the event's arrival (usually the event's own
row; earlier only if a later event of the key overtook it between the two source subtasks),
minus the event's arrival. p50/p99/max/mean over every event whose arrival is after the first
--skip-s seconds of the measured job's source and within its --duration-s.

Prints one `RESULT {json}` line: system "pyflink", config, workload "latency", rate,
latency_p50_ms, latency_p99_ms, latency_max_ms, latency_mean_ms, events (input events of the
measured run), events_measured, commits (watcher polls at which new finished files appeared:
the commits seen), keys, duration_s, part_files, source_rate, source_behind_p99_ms,
source_behind_max_ms, wall_s, peak_rss_mb (this process + the mini-cluster JVM),
loadavg_1m_after, flink_version.

Must run with the PyFlink virtualenv's python (apache-flink 2.x), not the project's venv; needs a
JDK (javac, jar) on PATH or under JAVA_HOME.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from process_tree import PeakRss  # noqa: E402 (standard library only, usable in this venv)
from w1_flink import flink_version, free_port, prepare_flink_home  # noqa: E402

PARALLELISM = 2
CKPT_INTERVAL = "1 s"
CONFIG = "hashmap-ckpt-1s-filesink-exactly-once"
GENERATOR_CLASS = "sparkpoint.bench.ArrivalStamp"
GENERATOR_SOURCE = """package sparkpoint.bench;

import java.util.concurrent.locks.LockSupport;
import org.apache.flink.api.java.tuple.Tuple3;
import org.apache.flink.connector.datagen.source.GeneratorFunction;

/**
 * Event n of a subtask's steady schedule: (n, its arrival, its generation), epoch ms. Arrival is
 * the time the schedule gives it, start + k / rate for the subtask's k-th event; generation is
 * the wall clock when it was generated, later than its arrival when the job holds the source back.
 */
public class ArrivalStamp implements GeneratorFunction<Long, Tuple3<Long, Long, Long>> {
    private final double nanosPerEvent;
    private transient long startNanos;
    private transient long startMillis;
    private transient long generated;

    public ArrivalStamp(double eventsPerSecondPerSubtask) {
        this.nanosPerEvent = 1e9 / eventsPerSecondPerSubtask;
    }

    @Override
    public Tuple3<Long, Long, Long> map(Long n) {
        long now = System.nanoTime();
        if (generated == 0) {
            startNanos = now;
            startMillis = System.currentTimeMillis();
        }
        double offset = generated++ * nanosPerEvent;
        long due = startNanos + (long) offset;
        // Ahead of the schedule by more than 1 ms: wait for it, a millisecond at a time so the
        // source thread's mailbox (checkpoint barriers) is not held up. Within 1 ms: emitted at
        // once, up to 1 ms before its arrival.
        while (due - now > 1_000_000L) {
            LockSupport.parkNanos(Math.min(due - now, 1_000_000L));
            now = System.nanoTime();
        }
        long arrival = startMillis + Math.round(offset / 1e6);
        return Tuple3.of(n, arrival, startMillis + (now - startNanos) / 1_000_000L);
    }
}
"""


def _jdk_tool(name: str) -> str:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", name)):
        return os.path.join(home, "bin", name)
    found = shutil.which(name)
    if not found:
        raise SystemExit(f"`{name}` not found: latency_flink.py compiles its source's generator function; "
                         "install a JDK 17 or set JAVA_HOME to one")
    return found


def build_generator_jar(work: str) -> str:
    """Compiles ArrivalStamp against the PyFlink package's flink-dist jar; returns the jar's path."""
    import pyflink

    lib = os.path.join(os.path.dirname(pyflink.__file__), "lib")
    dist = [os.path.join(lib, n) for n in os.listdir(lib) if n.startswith("flink-dist")]
    src = os.path.join(work, "generator", "src", "sparkpoint", "bench")
    classes = os.path.join(work, "generator", "classes")
    os.makedirs(src, exist_ok=True)
    os.makedirs(classes, exist_ok=True)
    with open(os.path.join(src, "ArrivalStamp.java"), "w") as f:
        f.write(GENERATOR_SOURCE)
    subprocess.run([_jdk_tool("javac"), "-nowarn", "--release", "11", "-cp", os.pathsep.join(dist), "-d", classes,
                    os.path.join(src, "ArrivalStamp.java")], check=True)
    jar = os.path.join(work, "generator", "arrival-stamp.jar")
    subprocess.run([_jdk_tool("jar"), "cf", jar, "-C", classes, "."], check=True)
    return jar


def stream_env(root: str, rest_port: int, jar: str):
    from w1_flink import environments

    settings = {
        "parallelism.default": str(PARALLELISM),
        "rest.port": str(rest_port),
        "rest.address": "127.0.0.1",
        "rest.bind-address": "127.0.0.1",
        "state.backend.type": "hashmap",
        "execution.checkpointing.interval": CKPT_INTERVAL,
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "execution.checkpointing.dir": "file://" + os.path.abspath(os.path.join(root, "checkpoints")),
        "pipeline.jars": "file://" + jar,
    }
    return environments(settings)


def paced_source(events: int, rate: int):
    """Java DataGeneratorSource(ArrivalStamp(rate / parallelism), events) wrapped for PyFlink."""
    from pyflink.datastream.connectors import Source
    from pyflink.java_gateway import get_gateway
    from pyflink.util.java_utils import load_java_class

    gateway = get_gateway()
    jvm = gateway.jvm
    cls = load_java_class(GENERATOR_CLASS)
    function = cls.getDeclaredConstructor(_java_array(gateway, jvm.Class, [jvm.java.lang.Double.TYPE])).newInstance(
        _java_array(gateway, jvm.Object, [jvm.java.lang.Double(float(rate) / PARALLELISM)]))
    long_type = jvm.org.apache.flink.api.common.typeinfo.Types.LONG
    type_info = jvm.org.apache.flink.api.common.typeinfo.Types.TUPLE(
        _java_array(gateway, jvm.org.apache.flink.api.common.typeinfo.TypeInformation, [long_type] * 3))
    return Source(jvm.org.apache.flink.connector.datagen.source.DataGeneratorSource(function, events, type_info))


def _java_array(gateway, cls, items):
    arr = gateway.new_array(cls, len(items))
    for i, x in enumerate(items):
        arr[i] = x
    return arr


class Watcher(threading.Thread):
    """Lists `out_dir` every `interval_s`; records when each finished (not hidden) file first appears."""

    def __init__(self, out_dir: str, interval_s: float = 0.01) -> None:
        super().__init__(daemon=True, name="output-watcher")
        self.out_dir, self.interval_s = out_dir, interval_s
        self.first_seen: dict[str, float] = {}
        self.commits = 0
        self._stop_flag = threading.Event()

    def scan(self) -> None:
        now = time.time()
        try:
            names = [e.name for e in os.scandir(self.out_dir) if e.is_file() and not e.name.startswith(".")]
        except FileNotFoundError:
            return
        new = [n for n in names if n not in self.first_seen]
        for n in new:
            self.first_seen[n] = now
        self.commits += bool(new)

    def run(self) -> None:
        while not self._stop_flag.is_set():
            self.scan()
            self._stop_flag.wait(self.interval_s)

    def stop(self) -> None:
        self._stop_flag.set()
        self.join()
        self.scan()


def read_updates(out_dir: str, first_seen: dict[str, float]) -> tuple[np.ndarray, ...]:
    """(key, max arrival, event arrival, event generation, visible ms) of every +I/+U row of the
    finished files: one row per event (no mini-batch), its arrival and generation the LAST_VALUEs."""
    keys, max_arr, arr, gen, vis = [], [], [], [], []
    for name, seen in first_seen.items():
        seen_ms = seen * 1000
        with open(os.path.join(out_dir, name)) as f:
            for line in f:
                if not (line.startswith("+I[") or line.startswith("+U[")):
                    continue  # -U: the retraction of the row's previous value
                k, _cnt, _sum, m, last, generated = line[3:line.rindex("]")].split(", ")
                keys.append(int(k))
                max_arr.append(int(m))
                arr.append(int(last))
                gen.append(int(generated))
                vis.append(seen_ms)
    return (np.array(keys, dtype=np.int64), np.array(max_arr, dtype=np.int64), np.array(arr, dtype=np.int64),
            np.array(gen, dtype=np.int64), np.array(vis, dtype=np.float64))


def event_latencies(keys, max_arr, arr, vis) -> np.ndarray:
    """Per event: visible time of the first row of its key (by visibility) with MAX(arrival) ≥ its
    arrival, minus its arrival."""
    t0 = int(arr.min())
    span = int(max(max_arr.max(), arr.max()) - t0) + 1
    order = np.lexsort((vis, keys))  # by key, then visibility
    k_s, vis_s = keys[order], vis[order]
    # key * span + (MAX(arrival) - t0): one increasing axis, with every key in its own range, so a running
    # max over the sorted rows is the per-key running max and one searchsorted answers every event.
    combined = np.maximum.accumulate(k_s * span + (max_arr[order] - t0))
    idx = np.searchsorted(combined, keys * span + (arr - t0), side="left")
    if (idx >= len(combined)).any() or (k_s[np.minimum(idx, len(k_s) - 1)] != keys).any():
        raise RuntimeError("an event's arrival is covered by no output row of its key")
    return vis_s[idx] - arr


def percentiles(lat_ms: np.ndarray) -> dict[str, Any]:
    return {"latency_p50_ms": round(float(np.percentile(lat_ms, 50)), 1),
            "latency_p99_ms": round(float(np.percentile(lat_ms, 99)), 1),
            "latency_max_ms": round(float(lat_ms.max()), 1),
            "latency_mean_ms": round(float(lat_ms.mean()), 1)}


def run_once(args, duration_s: float, run: str, work: str, jar: str, rss: PeakRss) -> dict[str, Any]:
    from pyflink.common import Types, WatermarkStrategy
    from pyflink.common.serialization import Encoder
    from pyflink.datastream.connectors.file_system import BucketAssigner, FileSink, RollingPolicy
    from pyflink.table import ChangelogMode, DataTypes, Schema

    root = os.path.join(work, f"latency-{run}")
    out_dir = os.path.join(root, "output")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(out_dir)
    env, t_env = stream_env(root, free_port(), jar)
    events = int(args.rate * duration_s)
    stream = env.from_source(paced_source(events, args.rate), WatermarkStrategy.no_watermarks(), "events",
                             Types.TUPLE([Types.LONG()] * 3))
    schema = (Schema.new_builder()
              .column("f0", "BIGINT")
              .column("f1", "BIGINT")
              .column("f2", "BIGINT")
              .column_by_expression("key", f"CAST(RAND_INTEGER({args.keys}) AS BIGINT)")
              .column_by_expression("value", "CAST(RAND_INTEGER(1000) AS BIGINT)")
              .build())
    t_env.create_temporary_view("events", t_env.from_data_stream(stream, schema))
    table = t_env.sql_query("SELECT key, COUNT(*) AS cnt, SUM(`value`) AS total, MAX(f1) AS max_arrival, "
                            "LAST_VALUE(f1) AS arrival, LAST_VALUE(f2) AS generated FROM events GROUP BY key")
    sink = (FileSink.for_row_format("file://" + out_dir, Encoder.simple_string_encoder())
            .with_bucket_assigner(BucketAssigner.base_path_bucket_assigner())
            .with_rolling_policy(RollingPolicy.on_checkpoint_rolling_policy())
            .build())
    # Upsert mode: +I/+U only (the group key is the table's primary key), as Flink's upsert sinks
    # take it; the -U retractions would double the rows written for nothing this reader needs.
    upsert_schema = (Schema.new_builder().column("key", DataTypes.BIGINT().not_null())
                     .column("cnt", DataTypes.BIGINT().not_null()).column("total", DataTypes.BIGINT())
                     .column("max_arrival", DataTypes.BIGINT()).column("arrival", DataTypes.BIGINT())
                     .column("generated", DataTypes.BIGINT()).primary_key("key").build())
    t_env.to_changelog_stream(table, upsert_schema, ChangelogMode.upsert()).sink_to(sink)
    watcher = Watcher(out_dir)
    watcher.start()
    rss.reset()
    started = time.monotonic()
    # The source is bounded (rate × duration events): the job ends after its final checkpoint,
    # which commits the last part files.
    env.execute(f"latency-{run}")
    wall = time.monotonic() - started
    watcher.stop()
    peak = rss.peak_mb
    keys, max_arr, arr, gen, vis = read_updates(out_dir, watcher.first_seen)
    if len(arr) != events:
        raise RuntimeError(f"{len(arr)} +I/+U rows in the committed output for {events} events")
    lat = event_latencies(keys, max_arr, arr, vis)
    t_first = arr.min()
    skip_s = args.skip_s if run == "measured" else 0
    keep = (arr >= t_first + skip_s * 1000) & (arr < t_first + duration_s * 1000)
    if not keep.any():
        raise RuntimeError("no event within the measured span: is --skip-s ≥ --duration-s?")
    behind = (gen - arr)[keep]
    if not os.environ.get("W1_FLINK_KEEP"):
        shutil.rmtree(root, ignore_errors=True)
    return {"system": "pyflink", "config": CONFIG, "workload": "latency", "rate": args.rate,
            **percentiles(lat[keep]), "events": events, "events_measured": int(keep.sum()), "keys": args.keys,
            "duration_s": duration_s, "commits": watcher.commits, "part_files": len(watcher.first_seen),
            "source_rate": round(events / max((gen.max() - gen.min()) / 1000, 1e-3), 1),
            "source_behind_p99_ms": round(float(np.percentile(behind, 99)), 1),
            "source_behind_max_ms": round(float(behind.max()), 1), "wall_s": round(wall, 1),
            "peak_rss_mb": peak, "peak_rss_by_process": rss.breakdown, "state_backend": "hashmap",
            "checkpoint_interval": CKPT_INTERVAL, "parallelism": PARALLELISM}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=50_000, help="events per second")
    p.add_argument("--duration-s", type=float, default=60)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--skip-s", type=float, default=5, help="events of the first seconds are not measured")
    p.add_argument("--warmup-s", type=float, default=10, help="a discarded job first (0: none)")
    p.add_argument("--work", default="/tmp/sparkpoint-bench",
                   help="the run's files go to <work>/pyflink-latency-<pid> (removed at the end unless "
                        "W1_FLINK_KEEP is set; kept with the JobManager log when the run fails)")
    args = p.parse_args()
    if args.rate <= 0 or args.duration_s <= 0 or args.keys <= 0:
        raise SystemExit("--rate, --duration-s and --keys must be positive")
    work = os.path.join(os.path.abspath(args.work), f"pyflink-latency-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    prepare_flink_home(work)
    jar = build_generator_jar(work)
    from pyflink.util.java_utils import add_jars_to_context_class_loader

    add_jars_to_context_class_loader(["file://" + jar])  # the client JVM builds the source with it
    rss = PeakRss()
    if args.warmup_s:
        run_once(args, args.warmup_s, "warmup", work, jar, rss)
    result = run_once(args, args.duration_s, "measured", work, jar, rss)
    result["loadavg_1m_after"] = os.getloadavg()[0]
    result["flink_version"] = flink_version()
    print("RESULT " + json.dumps(result), flush=True)
    rss.stop()
    if not os.environ.get("W1_FLINK_KEEP"):
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
