"""Where W1's CPU goes, by process and by Spark stage, with the hottest JVM methods
(Java Flight Recorder) and the hottest Python functions in the Spark Python workers
(py-spy). The machine has 2 cores and an epoch keeps both busy, so throughput is
bounded by CPU-seconds per event: this says which part of the stack spends them.

    python bench/w1_cpu_profile.py [--events 5000000] [--keys 100000] [--epoch-records 500000]
        [--py-spy] [--jfr] [--out /tmp/sparkpoint-bench/cpu-profile]

Needs `py-spy` (pip) for --py-spy and the JDK's `jfr` tool for --jfr.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

from w1_keyed_aggregate import run_once
import w1_workload
from w1_workload import W1, workload_arguments

TICKS = os.sysconf("SC_CLK_TCK")


def _tree(root: int) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        # A JVM forks from its other threads: every thread's children count.
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    return out


def _cpu_s(pid: int) -> float:
    """utime + stime of a process and its reaped children, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / TICKS
    except OSError:
        return 0.0


def _kind(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if pid == os.getpid():
        return "driver (Python)"
    if "java" in cmd.split(" ")[0]:
        return "Spark JVM (driver + local executor)"
    if "pyspark.daemon" in cmd or "pyspark/daemon" in cmd or "pyspark.worker" in cmd:
        return "Spark Python workers"
    return "other: " + cmd[:60]


def cpu_by_kind() -> dict[str, float]:
    totals: dict[str, float] = collections.defaultdict(float)
    for pid in _tree(os.getpid()):
        totals[_kind(pid)] += _cpu_s(pid) if pid != os.getpid() else sum(os.times()[:2])
    return dict(totals)


def jvm_pid() -> int:
    return next(p for p in _tree(os.getpid()) if _kind(p).startswith("Spark JVM"))


def jvm_threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per JVM thread name (digits folded: `GC Thread#0` and `#1` add up)."""
    out: dict[str, float] = collections.defaultdict(float)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out["".join("#" if ch.isdigit() else ch for ch in name)] += (int(fields[11]) + int(fields[12])) / TICKS
    return dict(out)


def spark_stages(spark) -> list[dict]:
    url = spark.sparkContext.uiWebUrl
    app = spark.sparkContext.applicationId
    with urllib.request.urlopen(f"{url}/api/v1/applications/{app}/stages?status=complete") as r:
        return json.load(r)


def classify(stage: dict) -> str:
    reads, writes = stage.get("shuffleReadRecords", 0), stage.get("shuffleWriteRecords", 0)
    if not reads and writes:
        return "1 read the input, partial aggregate, shuffle write"
    if reads and writes:
        return "2 a second shuffle (read and write)"
    if reads and not writes:
        return "3 shuffle read, final aggregate, state (sparkpoint: to the Python subtasks), output"
    return "other (no shuffle: sink commits, restores, probes)"


def top_jfr(path: str, n: int = 25) -> list[tuple[str, int]]:
    """Top frames of JFR execution samples: (method, samples)."""
    text = subprocess.run(["jfr", "print", "--events", "jdk.ExecutionSample", "--stack-depth", "1", path],
                          capture_output=True, text=True, check=True).stdout
    counts: collections.Counter[str] = collections.Counter()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "stackTrace = [" and i + 1 < len(lines):
            frame = lines[i + 1].strip()
            counts[frame.split("  line:")[0]] += 1
    return counts.most_common(n)


def top_pyspy(path: str, n: int = 30) -> tuple[list[tuple[str, int]], list[tuple[str, int]], int]:
    """From py-spy's collapsed stacks: self samples and inclusive samples per function."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            c = int(count)
            frames = stack.split(";")
            total += c
            own[frames[-1]] += c
            for fr in set(frames):
                incl[fr] += c
    return own.most_common(n), incl.most_common(n), total


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0])
    parser.add_argument("--system", choices=["sparkpoint", "spark-ss-hdfs", "spark-ss-rocksdb"], default="sparkpoint")
    parser.add_argument("--py-spy", action="store_true")
    parser.add_argument("--jfr", action="store_true")
    parser.add_argument("--out", default="/tmp/sparkpoint-bench/cpu-profile")
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    jfr_path = os.path.join(args.out, "spark.jfr")
    conf = {"spark.ui.enabled": "true", "spark.ui.port": "0"}
    if args.jfr:
        # Sampling only (the `profile` settings, 10/20 ms): a few percent of one core.
        conf["spark.driver.extraJavaOptions"] = (
            f"-XX:StartFlightRecording=settings=profile,filename={jfr_path},dumponexit=true")
    from sparkpoint.runtime.spark import get_or_create_spark

    spark = get_or_create_spark("local[2]", "bench-w1-cpu", 2, conf)
    w1 = W1(args.events, args.keys, args.epoch_records)
    warm = W1(args.warmup_events, args.keys, args.epoch_records)
    if args.system == "sparkpoint":
        run_once(spark, warm, "on", args.work, -1)

        def measured():
            return run_once(spark, w1, "on", args.work, 0)
    else:
        import w1_spark_ss

        store = args.system.rsplit("-", 1)[1]
        data = os.path.join(args.work, "data")
        w1_spark_ss.run_once(spark, warm, w1_workload.ensure_parquet_events(spark, warm, data), store, args.work, -1)
        files = w1_workload.ensure_parquet_events(spark, w1, data)

        def measured():
            return w1_spark_ss.run_once(spark, w1, files, store, args.work, 0)
    before_stages = {s["stageId"] for s in spark_stages(spark)}
    pyspy = None
    if args.py_spy:
        daemons = [p for p in _tree(os.getpid()) if _kind(p) == "Spark Python workers"]
        daemon = min(daemons)  # the daemon forked the workers: the lowest pid of them
        pyspy = subprocess.Popen(["py-spy", "record", "--pid", str(daemon), "--subprocesses", "--rate", "200",
                                  "--format", "raw", "--output", os.path.join(args.out, "workers.txt"),
                                  "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
    jvm = jvm_pid()
    cpu0, threads0, t0 = cpu_by_kind(), jvm_threads_cpu(jvm), time.monotonic()
    result = measured()
    wall = time.monotonic() - t0
    cpu1, threads1 = cpu_by_kind(), jvm_threads_cpu(jvm)
    if args.jfr:
        subprocess.run(["jcmd", str(jvm), "JFR.dump", "name=1", f"filename={jfr_path}"], check=True,
                       capture_output=True)
    if pyspy is not None:
        pyspy.send_signal(2)
        pyspy.wait(timeout=60)
    stages = [s for s in spark_stages(spark) if s["stageId"] not in before_stages]
    events = result["events"]
    report: dict = {"result": result, "wall_s": wall, "cpu_s": {}, "stages": {}}
    print(f"{args.system}: W1 {events:,} events, {w1.keys:,} keys, epochs of {w1.epoch_records:,}: {result['events_per_s']:,.0f} "
          f"events/s, wall {wall:.1f} s (incl. start-up and the final checkpoint)")
    print(f"\nCPU seconds by process (of {2 * wall:.1f} core-seconds available):")
    for kind in sorted(set(cpu0) | set(cpu1)):
        used = cpu1.get(kind, 0) - cpu0.get(kind, 0)
        report["cpu_s"][kind] = used
        print(f"  {kind:<42} {used:7.2f} s  = {1e6 * used / events:6.2f} us/event")
    total = sum(report["cpu_s"].values())
    print(f"  {'total':<42} {total:7.2f} s  = {1e6 * total / events:6.2f} us/event")
    print("\nSpark JVM CPU seconds by thread (names as the kernel sees them, digits folded):")
    report["jvm_threads_cpu_s"] = {}
    for name, used in sorted(((n, threads1.get(n, 0) - threads0.get(n, 0)) for n in threads1),
                             key=lambda x: -x[1])[:15]:
        report["jvm_threads_cpu_s"][name] = used
        print(f"  {name:<20} {used:7.2f} s")
    by: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for s in stages:
        c = by[classify(s)]
        c["stages"] += 1
        c["run_s"] += s.get("executorRunTime", 0) / 1000
        c["cpu_s"] += s.get("executorCpuTime", 0) / 1e9
        c["gc_s"] += s.get("jvmGcTime", 0) / 1000
        c["deser_s"] += s.get("executorDeserializeTime", 0) / 1000
        c["shuffle_read_mb"] += s.get("shuffleReadBytes", 0) / 1e6
        c["shuffle_write_mb"] += s.get("shuffleWriteBytes", 0) / 1e6
        c["records_in"] += s.get("inputRecords", 0) + s.get("shuffleReadRecords", 0)
    print("\nSpark stages of the measured run (task time summed over tasks; executor CPU is the JVM task "
          "thread's, not its Python worker's):")
    print(f"  {'stage':<82} {'n':>3} {'task s':>7} {'JVM cpu s':>9} {'gc s':>5} {'shuf r MB':>9} {'shuf w MB':>9}")
    for kind in sorted(by):
        c = by[kind]
        report["stages"][kind] = dict(c)
        print(f"  {kind:<82} {c['stages']:>3} {c['run_s']:>7.2f} {c['cpu_s']:>9.2f} {c['gc_s']:>5.2f} "
              f"{c['shuffle_read_mb']:>9.1f} {c['shuffle_write_mb']:>9.1f}")
    spark.stop()
    if args.py_spy:
        own, incl, samples = top_pyspy(os.path.join(args.out, "workers.txt"))
        report["pyspy"] = {"samples": samples, "own": own, "inclusive": incl}
        print(f"\nPython workers (py-spy, {samples} samples at 200 Hz), own time:")
        for fn, c in own[:20]:
            print(f"  {100 * c / samples:5.1f}%  {fn}")
        print("inclusive:")
        for fn, c in incl[:30]:
            print(f"  {100 * c / samples:5.1f}%  {fn}")
    if args.jfr:
        top = top_jfr(jfr_path)
        report["jfr_top"] = top
        n = sum(c for _, c in top)
        print(f"\nJVM hottest methods (JFR execution samples, warm-up and measured run; top {len(top)}):")
        for m, c in top:
            print(f"  {c:6d}  {m}")
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"\nreport: {os.path.join(args.out, 'report.json')}", file=sys.stderr)


if __name__ == "__main__":
    main()
