"""`sparkpoint chaos PIPELINE.py`: run a bounded pipeline once without faults and under
injected faults (each over one or more seeds), and compare the committed outputs row for row.

    sparkpoint chaos PIPELINE.py [--config FILE] [--set key=value ...] [--faults kill9,...]
                     [--seed N] [--seeds K] [--storm] [--checkpoint-dir URL] [--workdir DIR] [--json]

Every run is a real `sparkpoint run` process (its own process group) in its own directory
under the work directory: `--set` gives it a private checkpoint directory (under the work
directory, or under `--checkpoint-dir URL`, e.g. an S3 bucket) and state directory, and it
runs with that directory as its working directory, so a relative sink path (the demo's
`sparkpoint-demo/output`) lands there too. A pipeline whose sink path is absolute can read
the run's directory from the environment variable SPARKPOINT_CHAOS_RUN_DIR instead.

Nothing a run touches is shared with production or with another run (isolate()): a
KafkaSource's consumer group, a FileSource's dead-letter directory, a KafkaSink's topic
and transactional ids are the run's own. The faults (docs/chaos.md):

  kill9           SIGKILL the process group at 2-3 random moments (seeded); rerun until it finishes
  outage          checkpoint storage fails for a few checkpoints (sparkpoint.faults); no restart allowed
  corrupt         SIGKILL, then damage the newest completed checkpoint (its `_metadata` or a state
                  file only it references); the rerun must fall back to an older checkpoint
  second          a second deployment on the same checkpoint directory while the first runs: it
                  must be refused with one clear error, and the first must be unaffected
  executor-kill   a savepoint is triggered and a Spark Python worker is SIGKILLed while it is
                  being taken; the job recovers by itself
  restore-outage  SIGKILL, then the rerun's checkpoint storage fails every read of a state
                  file for 3 s from the first one (during restore); the job rides it out and
                  finishes

`--storm` runs one job for all seeds, injecting every chosen fault
once per seed into the same job (see Chaos._storm): many faults for few Spark starts.

The verdict compares each faulty run's committed output with the fault-free run's as
multisets of rows (the sink's `epoch` column is left out: where epochs begin depends on
timing, the rows do not; epochs are not cut by time unless the config says so, see
_fixed_epochs): lost = rows missing, duplicated = rows committed too often.
The report (a table) is printed and written to `<workdir>/chaos-report.md`.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import click

FAULTS = ("kill9", "outage", "corrupt", "second", "executor-kill", "restore-outage")
RUN_DIR_ENV = "SPARKPOINT_CHAOS_RUN_DIR"
# Set (to "1") for a run that chaos leaves alone once it has restored (a storm's last
# segment, which only has to finish): a pipeline may drop pacing that only keeps it from
# outrunning the faults, and finish sooner.
FAULTS_DONE_ENV = "SPARKPOINT_CHAOS_FAULTS_DONE"
COMPLETED = re.compile(r"completed checkpoint (\d+) of job")
TRIGGERED_FORCED = re.compile(r"triggering checkpoint (\d+) @ \d+ for job .*, forced\)")
RESTORE_OUTAGE_S = 3.0  # a storage outage during restore, as operators see them (a few seconds)
SUMMARY = re.compile(r"^job (\S+) (\w+): (\d+) epochs, .* (\d+) checkpoints completed, (\d+) failed, (\d+) restarts")
OUTPUT_LINE = re.compile(r"^\s*exactly-once output : (\S+)")
RESTARTING = re.compile(r"job status \w+ -> RESTARTING")
ENDED_WITH_ERROR = re.compile(r"^sparkpoint: error: (.*)")
FAILING_OVER = re.compile(r" failing over: (.*)")
UNCAUGHT = re.compile(r"^((?:\w+\.)*\w*(?:Error|Exception)(?:: .*)?)$")  # a traceback's last line
DROPPED_COLUMNS = ("epoch",)


class ChaosError(click.ClickException):
    """The chaos run itself cannot go on (not a verdict): exit code 2."""

    exit_code = 2


# -- one `sparkpoint run` process ------------------------------------------------------

class Run:
    """A `sparkpoint run` subprocess in its own process group; its output is collected
    line by line (and written to `log`)."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict[str, str], log: Path):
        self.log = log
        self.lines: list[str] = []
        self.started = time.monotonic()
        self.first_epoch_at: float | None = None
        self.ended: float | None = None
        self._cond = threading.Condition()
        self._file = log.open("a")
        self._file.write("$ " + " ".join(cmd) + "\n")
        self.popen = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            line = line.rstrip("\n")
            self._file.write(line + "\n")
            with self._cond:
                if self.first_epoch_at is None and " RUNNING epoch " in line:
                    self.first_epoch_at = time.monotonic()
                self.lines.append(line)
                self._cond.notify_all()
        self._file.flush()
        with self._cond:
            self._cond.notify_all()

    @property
    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_for(self, rx: re.Pattern, timeout: float) -> re.Match | None:
        """The first line matching `rx` (waits for it); None if the process ended or the
        time ran out first."""
        deadline = time.monotonic() + timeout
        i = 0
        with self._cond:
            while True:
                while i < len(self.lines):
                    m = rx.search(self.lines[i])
                    if m:
                        return m
                    i += 1
                if (self.popen.poll() is not None and not self._reader.is_alive()) or time.monotonic() > deadline:
                    return None
                self._cond.wait(0.25)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if it still runs after `timeout` seconds."""
        try:
            rc = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._finish()
        return rc

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def kill9(self) -> None:
        """SIGKILL the whole process group: the driver, its JVM and the Python workers."""
        self.signal(signal.SIGKILL)
        self.popen.wait(60)
        self._finish()

    def _finish(self) -> None:
        self._reader.join(10)
        if self.ended is None:
            self.ended = time.monotonic()
            self._file.close()

    def count(self, rx: re.Pattern) -> int:
        with self._cond:
            return sum(1 for line in self.lines if rx.search(line))

    def summary(self) -> dict[str, Any] | None:
        """`job NAME FINISHED: ... K checkpoints completed, F failed, R restarts`."""
        with self._cond:
            for line in reversed(self.lines):
                m = SUMMARY.search(line)
                if m:
                    return {"status": m.group(2), "completed": int(m.group(4)), "failed": int(m.group(5)),
                            "restarts": int(m.group(6))}
        return None

    def cause(self) -> str | None:
        """Why the run ended, in its own words: the last error line it printed (`sparkpoint:
        error:`, an uncaught exception's line, a failover). The report keeps it, so a
        failure stays explainable when the run's log is gone (a CI machine's temporary
        directory)."""
        with self._cond:
            lines = list(self.lines)
        for line in reversed(lines):
            m = ENDED_WITH_ERROR.search(line) or UNCAUGHT.search(line) or FAILING_OVER.search(line)
            if m:
                return m.group(1)[:300]
        return None

    def tail(self, n: int = 15) -> str:
        with self._cond:
            return "\n".join(self.lines[-n:])


# -- comparing committed output --------------------------------------------------------

def _rows(table, drop: tuple[str, ...]) -> Counter:
    cols = sorted(c for c in table.column_names if c not in drop)
    return Counter(tuple(row[c] for c in cols) for row in table.select(cols).to_pylist())


def committed_rows(path: str, drop: tuple[str, ...] = DROPPED_COLUMNS) -> Counter:
    """The committed output (exactly the files the sink's log lists, as Spark reads them)
    as a multiset of rows, without the columns in `drop`."""
    from sparkpoint.connectors.parquet_sink import read_committed

    if not os.path.exists(path):
        return Counter()
    return _rows(read_committed(path), drop)


def delta_rows(path: str, drop: tuple[str, ...] = DROPPED_COLUMNS) -> Counter:
    """What the Delta table's readers see (through delta-rs, not through sparkpoint)."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(path):
        return Counter()
    return _rows(DeltaTable(path).to_pyarrow_table(), drop)


def kafka_rows(bootstrap: str, topic: str, timeout: float = 60.0) -> Counter:
    """Every (key, value) a read_committed consumer sees in `topic`, all partitions, as
    text: what a downstream consumer of the sink gets."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"sparkpoint-chaos-reader-{os.getpid()}",
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "enable.auto.commit": False, "log_level": 0})
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            return Counter()
        parts = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        open_parts, rows = set(parts), Counter()
        deadline = time.monotonic() + timeout
        while open_parts:
            if time.monotonic() > deadline:
                raise ChaosError(f"reading the output topic {topic}: no end of partitions {sorted(open_parts)} "
                                 f"within {timeout:.0f} s")
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    open_parts.discard(msg.partition())
                    continue
                raise ChaosError(f"reading the output topic {topic}: {msg.error()}")
            decode = (lambda b: None if b is None else b.decode("utf-8", "replace"))  # noqa: E731
            rows[(decode(msg.key()), decode(msg.value()))] += 1
        return rows
    finally:
        consumer.close()


@dataclass(frozen=True)
class Output:
    """Where a run's committed output is: `where` is a path relative to the run's
    directory (parquet, delta) or the production topic a run's own topic is named after
    (kafka)."""

    kind: str
    where: str
    bootstrap: str = ""
    partitions: int = 1


def compare(expected: Counter, got: Counter) -> dict[str, int]:
    """lost: rows of the fault-free run missing (counting multiplicity); duplicated: rows
    committed more often than the fault-free run did; unexpected: rows it never had."""
    lost = sum(max(0, n - got.get(row, 0)) for row, n in expected.items())
    duplicated = sum(max(0, n - expected[row]) for row, n in got.items() if row in expected)
    unexpected = sum(n for row, n in got.items() if row not in expected)
    return {"expected": sum(expected.values()), "committed": sum(got.values()), "lost": lost,
            "duplicated": duplicated, "unexpected": unexpected}


# -- reading a job's checkpoints -------------------------------------------------------

def _completed(fs, layout) -> dict[int, Any]:
    """checkpoint id -> decoded metadata for every readable completed checkpoint."""
    from sparkpoint.errors import CorruptCheckpointError, ForeignCheckpointError
    from sparkpoint.storage import metadata
    from sparkpoint.storage.ids import list_checkpoint_ids

    done = {}
    try:
        ids = list_checkpoint_ids(fs, layout)
    except FileNotFoundError:
        return done
    for cid in ids:
        try:
            data = metadata.read_completed(fs, layout, cid)
        except (CorruptCheckpointError, ForeignCheckpointError, FileNotFoundError):
            continue
        if data is not None:
            done[cid] = data
    return done


def _state_files_only_in(done: dict[int, Any], latest: int, older: int) -> list[str]:
    """Change logs (paths relative to the job directory) that checkpoint `latest`
    references for epochs after `older`'s and no other retained checkpoint references:
    damaging one breaks `latest` and nothing else."""
    from sparkpoint.state.changelog import Lineage, is_lineage_handle

    def lineages(data):
        return [Lineage.from_json(h) for h in data.handles.values() if is_lineage_handle(h)]

    others = {f.path for cid, data in done.items() if cid != latest for lin in lineages(data) for f in lin.files()}
    after = int(done[older].handles["job"]["epoch"])
    return [c.file.path for lin in lineages(done[latest]) for c in lin.changelog
            if c.epoch > after and c.file.path not in others]


def _flip_bytes(fs, path: str, at: int = 0) -> None:
    """Bit rot: 16 bytes flipped, size unchanged (through the storage's own API, so it
    works on an object store too)."""
    data = bytearray(fs.read_bytes(path))
    for i in range(at, min(at + 16, len(data))):
        data[i] ^= 0x5A
    fs.write_atomic(path, bytes(data))


# -- keeping a run apart from production and from the other runs -------------------

def run_tag(workdir: Path, rundir: Path) -> str:
    """A name no other run (of this or another chaos invocation) uses."""
    import hashlib

    return f"{hashlib.sha1(str(workdir.resolve()).encode()).hexdigest()[:8]}-{rundir.name}"


def run_topic(topic: str, tag: str) -> str:
    return f"{topic}.chaos-{tag}"


def isolate(pipeline, tag: str, rundir: str):
    """The pipeline with everything it would share outside its run directory made the
    run's own: a KafkaSource's consumer group (its offsets are production's), a
    FileSource's dead-letter directory, a KafkaSink's topic and transactional ids (a
    production producer would be fenced). Parquet and Delta paths move with the working
    directory (Chaos.probe checks them)."""
    from sparkpoint.connectors.files import FileSource
    from sparkpoint.connectors.kafka_sink import KafkaSink
    from sparkpoint.connectors.kafka_source import KafkaSource

    for source in (node.source for node in pipeline.sources()):
        if isinstance(source, KafkaSource) and source.group_id:
            source.group_id = f"{source.group_id}.chaos-{tag}"
        if isinstance(source, FileSource) and source.dead_letter is not None:
            source.dead_letter = os.path.join(rundir, "dead-letter", source.name)
    for sink in (node.sink for node in pipeline.sinks()):
        if isinstance(sink, KafkaSink):
            sink.topic = run_topic(sink.topic, tag)
            sink.transactional_id_prefix = f"{sink.transactional_id_prefix}.chaos-{tag}"
    return pipeline


def load_isolated(pipeline_file: str, tag: str, rundir: str):
    """What a run's generated pipeline file calls: the user's pipeline, isolated."""
    from sparkpoint.ops.cli import _load_pipeline

    return isolate(_load_pipeline(pipeline_file), tag, rundir)


_WRAPPER = """\
# Written by `sparkpoint chaos`: {pipeline} with this run's own consumer group, dead-letter
# directory, output topic and transactional ids (sparkpoint.ops.chaos.isolate).
from sparkpoint.ops.chaos import load_isolated

pipeline = load_isolated({pipeline!r}, {tag!r}, {rundir!r})
"""


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    if topic in admin.list_topics(timeout=30).topics:
        return
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


# -- Spark's Python workers of a run ----------------------------------------------------

def python_workers(root: int) -> list[int]:
    """The Spark Python workers of a run (the process tree under `root`): the processes
    pyspark's daemon forked. The daemon puts itself in a process group of its own, so
    they are found by parentage. The daemon itself is left alive, as an executor loss
    leaves its host."""
    procs: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        procs[int(entry)] = (parent, cmd)
    tree, frontier = set(), {root}
    while frontier:
        tree |= frontier
        frontier = {pid for pid, (parent, _) in procs.items() if parent in frontier and pid not in tree}
    daemons = {pid for pid in tree if "pyspark.daemon" in procs.get(pid, (0, ""))[1]
               and "pyspark.daemon" not in procs.get(procs[pid][0], (0, ""))[1]}
    return sorted(pid for pid in tree if procs.get(pid, (0, ""))[0] in daemons)


# -- the verdicts ----------------------------------------------------------------------

@dataclass
class Verdict:
    fault: str
    seed: int = 0
    injected: str = ""
    restarts: int = 0
    lost: int | None = None
    duplicated: int | None = None
    unexpected: int | None = None
    committed: int | None = None
    passed: bool = False
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    directory: str = ""

    def fail(self, note: str) -> None:
        self.passed = False
        self.notes.append(note)


@dataclass
class Report:
    pipeline: str
    seed: int
    workdir: str
    reference: dict[str, Any]
    verdicts: list[Verdict]
    sink: str = "parquet"
    storage: str = "local"

    @property
    def ok(self) -> bool:
        return bool(self.verdicts) and all(v.passed for v in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "seed": self.seed, "workdir": self.workdir, "ok": self.ok,
                "sink": self.sink, "storage": self.storage, "reference": self.reference,
                "faults": [asdict(v) for v in self.verdicts], "summary": self.summary()}

    def summary(self) -> list[dict[str, Any]]:
        """Per fault kind: runs, seeds, rows lost and duplicated in all of them."""
        kinds: dict[str, dict[str, Any]] = {}
        for v in self.verdicts:
            k = kinds.setdefault(v.fault, {"fault": v.fault, "sink": self.sink, "storage": self.storage,
                                           "runs": 0, "seeds": [], "lost": 0, "duplicated": 0, "passed": 0})
            k["runs"] += 1
            k["seeds"].append(v.seed)
            k["lost"] += v.lost or 0
            k["duplicated"] += (v.duplicated or 0) + (v.unexpected or 0)
            k["passed"] += int(v.passed)
        return list(kinds.values())

    def render(self) -> str:
        ref = self.reference
        head = ["fault", "seed", "injected", "restarts", "lost", "duplicated", "verdict"]
        rows = [[v.fault, str(v.seed), v.injected, str(v.restarts), _num(v.lost),
                 _num(v.duplicated) + (f" (+{v.unexpected} unexpected)" if v.unexpected else ""),
                 "PASS" if v.passed else "FAIL"] for v in self.verdicts]
        out = [f"sparkpoint chaos {self.pipeline} (seed {self.seed}; sink {self.sink}, "
               f"checkpoints on {self.storage})",
               f"expected output: {ref['rows']:,} rows ({ref.get('source', 'fault-free run')}"
               + (f", {ref['seconds']:.0f} s" if ref.get("seconds") else "") + ")", "",
               *_table(head, rows), ""]
        sums = self.summary()
        out += _table(["fault", "sink", "runs", "lost", "duplicated", "passed"],
                      [[k["fault"], k["sink"], str(k["runs"]), str(k["lost"]), str(k["duplicated"]),
                        f"{k['passed']}/{k['runs']}"] for k in sums])
        out.append("")
        for v in self.verdicts:
            for note in v.notes:
                out.append(f"  {v.fault} (seed {v.seed}): {note}")
        out.append(f"{'PASS' if self.ok else 'FAIL'}: {sum(v.passed for v in self.verdicts)} of "
                   f"{len(self.verdicts)} faulty runs passed; runs and logs in {self.workdir}")
        return "\n".join(out)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table, aligned so that it also reads as plain text."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: ("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")  # noqa: E731
    return [line(head), line(["-" * w for w in widths]), *map(line, rows)]


def _num(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


# -- the chaos run ---------------------------------------------------------------------

class Chaos:
    def __init__(self, pipeline_file: str, config_file: str | None, sets: tuple[str, ...], faults: list[str],
                 seed: int, workdir: Path, timeout: float, kills: int | None, parallel: int = 1,
                 echo: Callable[[str], None] = lambda s: None, seeds: int = 1, storm: bool = False,
                 checkpoint_base: str | None = None, expected: Counter | None = None):
        self.pipeline_file = str(Path(pipeline_file).resolve())
        self.config_file = str(Path(config_file).resolve()) if config_file else None
        self.user_sets = list(sets)
        self.faults = faults
        self.seed = seed
        self.seeds = [seed + i for i in range(max(1, seeds))]
        self.storm = storm
        self.workdir = workdir
        self.checkpoint_base = checkpoint_base.rstrip("/") if checkpoint_base else None
        self.timeout = timeout
        self.kills = kills
        self.parallel = max(1, parallel)
        self.echo = echo
        self.given_expected = expected  # an oracle's rows instead of a fault-free run
        self.runs: list[Run] = []
        self._runs_lock = threading.Lock()
        self._local = threading.local()  # the current fault's runs and random numbers

    @property
    def rng(self) -> random.Random:
        return self._local.rng

    # ---- set-up
    def probe(self) -> None:
        """Load the pipeline and its settings here (no Spark) to learn the job name and
        where its sink writes: that location must move with the run's directory."""
        from sparkpoint.config import Settings
        from sparkpoint.connectors.delta_sink import DeltaSink
        from sparkpoint.connectors.kafka_sink import KafkaSink
        from sparkpoint.connectors.parquet_sink import ParquetSink
        from sparkpoint.errors import SparkpointError
        from sparkpoint.ops.cli import _load_pipeline

        probe = self.workdir / "probe"
        probe.mkdir(parents=True, exist_ok=True)
        old_cwd, old_env = os.getcwd(), os.environ.get(RUN_DIR_ENV)
        os.chdir(probe)
        os.environ[RUN_DIR_ENV] = str(probe)
        try:
            pipeline = _load_pipeline(self.pipeline_file)
            self.settings = Settings.load(self.config_file, self.user_sets,
                                          base={"pipeline.name": pipeline.name} if pipeline.name else None)
        except SparkpointError as e:
            raise ChaosError(str(e)) from None
        finally:
            os.chdir(old_cwd)
            if old_env is None:
                os.environ.pop(RUN_DIR_ENV, None)
            else:
                os.environ[RUN_DIR_ENV] = old_env
        self.job_name = self.settings.job_name
        self.storage_options = dict(self.settings.storage_options or {})
        sink = pipeline.sink_
        if isinstance(sink, KafkaSink):
            self.output = Output("kafka", sink.topic, sink.bootstrap_servers, self._partitions(sink))
            return
        if not isinstance(sink, (ParquetSink, DeltaSink)):
            raise ChaosError(f"sparkpoint chaos compares Parquet, Delta or Kafka output; the sink of "
                             f"{self.pipeline_file} is a {type(sink).__name__}")
        kind, cls = ("delta", "DeltaSink") if isinstance(sink, DeltaSink) else ("parquet", "ParquetSink")
        path = os.path.realpath(sink.path) if "://" not in sink.path else sink.path
        root = os.path.realpath(probe)
        if "://" in path or os.path.commonpath([path, root]) != root:
            raise ChaosError(
                f"the sink writes to {sink.path}, which every run would share. Give {cls} a relative path "
                f"(each run's directory is its working directory) or build it from the environment variable "
                f"{RUN_DIR_ENV}, e.g. {cls}(os.environ.get('{RUN_DIR_ENV}', '.') + '/out')")
        self.output = Output(kind, os.path.relpath(path, root))

    @staticmethod
    def _partitions(sink) -> int:
        """The production topic's partition count, for the runs' own topics (1 if it
        does not exist or the broker cannot say)."""
        try:
            from confluent_kafka.admin import AdminClient

            meta = AdminClient({"bootstrap.servers": sink.bootstrap_servers, "log_level": 0}).list_topics(
                sink.topic, timeout=20).topics.get(sink.topic)
            return max(1, len(meta.partitions)) if meta is not None and meta.error is None else 1
        except Exception:  # noqa: BLE001 - only a default for the runs' topics
            return 1

    def checkpoint_dir(self, rundir: Path) -> str:
        if self.checkpoint_base:
            return f"{self.checkpoint_base}/{run_tag(self.workdir, rundir)}"
        return str(rundir / "checkpoints")

    def _fixed_epochs(self) -> list[str]:
        """Epochs are not cut by time in chaos runs unless the config sizes them itself.
        An epoch that outlasts the sizer's ceiling (a Spark start on a loaded machine
        does) cuts the next ones smaller, and an update-mode step then commits other rows
        for the same input (the running totals of other prefixes): the verdict would
        count them as lost and unexpected although nothing was."""
        settings = getattr(self, "settings", None)
        if settings is None or settings.epoch_max_ms is not None or settings.epoch_target_ms:
            return []
        return ["sparkpoint.epoch.max-duration=0"]

    def command(self, rundir: Path, extra: list[str]) -> list[str]:
        sets = [*self.user_sets,
                f"execution.checkpointing.dir={self.checkpoint_dir(rundir)}",
                f"state.local.dir={rundir / 'state'}",
                "rest.port=0",                 # runs side by side must not fight over 8081
                "sparkpoint.progress=true",    # the `RUNNING epoch` lines time the kills
                "sparkpoint.faults=[]",        # a config's rehearsal rules never reach the fault-free run
                *self._fixed_epochs(),
                *extra]
        wrapper = rundir / "chaos_pipeline.py"
        cmd = [sys.executable, "-m", "sparkpoint.ops.cli", "--log-level", "INFO", "run", str(wrapper)]
        if self.config_file:
            cmd += ["--config", self.config_file]
        for s in sets:
            cmd += ["--set", s]
        return cmd

    def run_pipeline(self, rundir: Path) -> Path:
        """The pipeline file a run starts: the user's, isolated (isolate())."""
        rundir.mkdir(parents=True, exist_ok=True)
        wrapper = rundir / "chaos_pipeline.py"
        wrapper.write_text(_WRAPPER.format(pipeline=self.pipeline_file, tag=run_tag(self.workdir, rundir),
                                           rundir=str(rundir)))
        return wrapper

    def launch(self, rundir: Path, name: str, extra: list[str] | None = None, faults_done: bool = False) -> Run:
        if not (rundir / "chaos_pipeline.py").exists():
            self.run_pipeline(rundir)
            if self.output.kind == "kafka":
                _create_topic(self.output.bootstrap, run_topic(self.output.where, run_tag(self.workdir, rundir)),
                              self.output.partitions)
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
        env[RUN_DIR_ENV] = str(rundir)
        env.pop(FAULTS_DONE_ENV, None)
        if faults_done:
            env[FAULTS_DONE_ENV] = "1"
        run = Run(self.command(rundir, extra or []), rundir, env, rundir / f"{name}.log")
        with self._runs_lock:
            self.runs.append(run)
        getattr(self._local, "runs", []).append(run)
        return run

    def finish(self, run: Run, verdict: Verdict | None, what: str) -> int | None:
        rc = run.wait(self.timeout)
        if rc is None:
            run.kill9()
            msg = f"{what} did not finish within {self.timeout:.0f} s (is the pipeline bounded?); see {run.log}"
            if verdict is None:
                raise ChaosError(msg)
            verdict.fail(msg)
        return rc

    def output_rows(self, rundir: Path) -> Counter:
        out = self.output
        if out.kind == "kafka":
            return kafka_rows(out.bootstrap, run_topic(out.where, run_tag(self.workdir, rundir)))
        path = str(rundir / out.where)
        return delta_rows(path) if out.kind == "delta" else committed_rows(path)

    def storage(self, rundir: Path):
        """The run's checkpoint storage and job layout, as the run sees them."""
        from sparkpoint.storage.fs import StorageFS
        from sparkpoint.storage.layout import JobLayout

        options = {**self.storage_options, "skip_instance_cache": True} if self.checkpoint_base else None
        fs = StorageFS.from_url(self.checkpoint_dir(rundir), options)
        return fs, JobLayout(f"{fs.root}/{self.job_name}")

    def cleanup(self) -> None:
        with self._runs_lock:
            runs = list(self.runs)
        for run in runs:
            if run.alive():
                run.kill9()

    # ---- the fault-free run
    def reference(self) -> dict[str, Any]:
        if self.given_expected is not None:
            self.expected = Counter(self.given_expected)
            self.span = 10.0
            return {"rows": sum(self.expected.values()), "source": "oracle", "directory": ""}
        rundir = self.workdir / "reference"
        self.echo(f"chaos: fault-free run in {rundir}")
        run = self.launch(rundir, "run")
        rc = self.finish(run, None, "the fault-free run")
        summary = run.summary()
        if rc != 0 or not summary or summary["status"] != "FINISHED":
            raise ChaosError(f"the fault-free run did not finish (exit code {rc}); see {run.log}:\n{run.tail()}")
        self.expected = self.output_rows(rundir)
        if not self.expected:
            raise ChaosError(f"the fault-free run committed no {self.output.kind} output ({self.output.where}): "
                             f"nothing to compare")
        start = run.first_epoch_at or run.started
        self.span = max(1.0, run.ended - start)  # seconds of processing (Spark start-up excluded)
        info = {"rows": sum(self.expected.values()), "seconds": round(run.ended - run.started, 1),
                "processing_seconds": round(self.span, 1), "checkpoints": summary["completed"],
                "directory": str(rundir)}
        self.echo(f"chaos: fault-free run: {info['rows']:,} rows, {info['checkpoints']} checkpoints, "
                  f"{info['seconds']:.0f} s")
        return info

    def judge(self, verdict: Verdict, rundir: Path, last: Run, rc: int | None, runs: list[Run]) -> None:
        summary = last.summary()
        verdict.restarts += sum(r.count(RESTARTING) for r in runs)
        if rc != 0 or not summary or summary["status"] != "FINISHED":
            cause = last.cause()
            verdict.fail(f"the last run ended with exit code {rc}, not FINISHED"
                         + (f" ({cause})" if cause else "") + f"; see {last.log}")
        got = self.output_rows(rundir)
        diff = compare(self.expected, got)
        verdict.lost, verdict.duplicated = diff["lost"], diff["duplicated"]
        verdict.unexpected, verdict.committed = diff["unexpected"], diff["committed"]
        if diff["lost"] or diff["duplicated"] or diff["unexpected"]:
            verdict.fail(f"committed {diff['committed']:,} rows, the fault-free run {diff['expected']:,}")

    def scenario(self, fault: str, seed: int | None = None) -> Verdict:
        seed = self.seed if seed is None else seed
        rundir = self.workdir / (fault if len(self.seeds) == 1 else f"{fault}-s{seed}")
        verdict = Verdict(fault, seed, directory=str(rundir), passed=True)
        # Each fault draws from its own generator: the same seed gives the same moments
        # and choices whichever faults run, and in whichever order.
        self._local.rng = random.Random(f"{seed}:{fault}")
        self._local.runs = []
        began = time.monotonic()
        self.echo(f"chaos: {fault} in {rundir}")
        try:
            getattr(self, f"_{fault.replace('-', '_')}")(rundir, verdict)
        except ChaosError as e:
            verdict.fail(e.message)
        except Exception as e:  # noqa: BLE001 - one fault's harness trouble is its verdict, not the others'
            verdict.fail(f"chaos could not carry out this fault: {type(e).__name__}: {e}")
        finally:
            for run in self._local.runs:
                if run.alive():
                    run.kill9()
        verdict.seconds = round(time.monotonic() - began, 1)
        self.echo(f"chaos: {fault} (seed {seed}): {'PASS' if verdict.passed else 'FAIL'} ({verdict.seconds:.0f} s)")
        return verdict

    # ---- kill9: SIGKILL at random moments, rerun until it finishes
    def _kill9(self, rundir: Path, verdict: Verdict) -> None:
        planned = self.kills or self.rng.choice((2, 3))
        runs: list[Run] = []
        kills: list[str] = []
        while True:
            run = self.launch(rundir, "run")
            runs.append(run)
            if len(kills) >= planned:
                break
            # A random moment of processing: after the first epoch of this run, within the
            # fault-free run's processing time (a rerun also replays since its checkpoint).
            if run.wait_for(re.compile(r" RUNNING epoch "), self.timeout) is None:
                break
            delay = self.rng.uniform(0.05, 0.6) * self.span
            if run.wait(delay) is not None:
                break  # it finished before the moment came
            run.kill9()
            kills.append(f"{time.monotonic() - run.first_epoch_at:.1f}s")
            self.echo(f"chaos: kill9: SIGKILL {len(kills)} of {planned}, {kills[-1]} into processing")
        rc = self.finish(runs[-1], verdict, "the last run")
        verdict.injected = f"{len(kills)} SIGKILL" + (f" ({', '.join(kills)} in)" if kills else "")
        verdict.restarts = len(kills)
        self.judge(verdict, rundir, runs[-1], rc, runs)
        if not kills:
            verdict.fail("no SIGKILL landed: every run finished before its moment (not exercised)")
        elif len(kills) < planned:
            verdict.notes.append(f"{len(kills)} of {planned} planned SIGKILLs landed; the run finished first")

    # ---- outage: checkpoint storage fails for a few checkpoints; the job rides it out
    def _outage(self, rundir: Path, verdict: Verdict) -> None:
        n = min(3, max(1, self.settings.tolerable_failed_checkpoints))
        first = self.rng.choice((2, 3))
        ids = list(range(first, first + n))
        rules = [{"op": op, "path": "*", "checkpoints": ids, "action": "fail"}
                 for op in ("mkdir", "create_exclusive", "write", "upload")]
        run = self.launch(rundir, "run", [f"sparkpoint.faults={json.dumps(rules)}"])
        rc = self.finish(run, verdict, "the run")
        self.judge(verdict, rundir, run, rc, [run])
        summary = run.summary() or {}
        failed = summary.get("failed", 0)
        which = f"checkpoints {ids[0]}-{ids[-1]}" if len(ids) > 1 else f"checkpoint {ids[0]}"
        verdict.injected = f"storage fails for {which} ({failed} failed)"
        if verdict.restarts:
            verdict.fail(f"the job restarted {verdict.restarts} time(s) during a storage outage of {n} "
                         f"checkpoint(s) (execution.checkpointing.tolerable-failed-checkpoints="
                         f"{self.settings.tolerable_failed_checkpoints})")
        if not failed:
            verdict.fail(f"no checkpoint failed: the run ended before checkpoint {ids[0]} (not exercised)")

    # ---- corrupt: SIGKILL, damage the newest completed checkpoint, the rerun falls back
    def _corrupt(self, rundir: Path, verdict: Verdict) -> None:
        extra = []
        if self.settings.num_retained < 2:
            extra = ["execution.checkpointing.num-retained=2"]
            verdict.notes.append("ran with execution.checkpointing.num-retained=2: falling back needs an older one")
        fs, layout = self.storage(rundir)
        target = self.rng.choice(("_metadata", "state file"))

        def plan():
            try:
                return look()
            except Exception:  # noqa: BLE001 - a checkpoint subsumed while we read it: look again
                return None

        def look():
            done = _completed(fs, layout)
            if len(done) < 2:
                return None
            latest, older = sorted(done)[-1], sorted(done)[-2]
            if target == "state file":
                only = _state_files_only_in(done, latest, older)
                if only:
                    return latest, "state file", layout.resolve(only[-1])
            return latest, "_metadata", layout.metadata(latest)

        first = self.launch(rundir, "run", extra)
        found = None
        deadline = time.monotonic() + self.timeout
        while found is None and first.alive() and time.monotonic() < deadline:
            if plan() is not None:
                first.signal(signal.SIGSTOP)  # frozen: what we see is what the kill leaves
                found = plan()
                if found is None:
                    first.signal(signal.SIGCONT)
                    continue
                first.kill9()
                break
            time.sleep(0.3)
        if found is None:
            rc = self.finish(first, verdict, "the run")
            verdict.injected = "nothing"
            self.judge(verdict, rundir, first, rc, [first])
            verdict.fail("the run ended before two checkpoints were completed (not exercised)")
            return
        latest, what, path = found
        _flip_bytes(fs, path, at=0)
        verdict.injected = f"SIGKILL, {what} of chk-{latest} damaged"
        self.echo(f"chaos: corrupt: SIGKILL, damaged {path}")
        rerun = self.launch(rundir, "run", extra)
        rc = self.finish(rerun, verdict, "the rerun")
        verdict.restarts = 1
        self.judge(verdict, rundir, rerun, rc, [first, rerun])
        resumed = [int(x) for x in re.findall(r"resuming from checkpoint (\d+)", rerun.text)]
        skipped = re.search(rf"(skipping chk-{latest}:|ALARM checkpoint {latest} of job .* is corrupt)", rerun.text)
        if not skipped or not any(cid < latest for cid in resumed):
            verdict.fail(f"the rerun did not report chk-{latest} as corrupt and fall back to an older checkpoint "
                         f"(resumed from {resumed or 'nothing'})")

    # ---- second: a second deployment on the same checkpoint directory
    def _second(self, rundir: Path, verdict: Verdict) -> None:
        first = self.launch(rundir, "run")
        if first.wait_for(COMPLETED, self.timeout) is None:
            rc = self.finish(first, verdict, "the first run")
            verdict.injected = "nothing"
            self.judge(verdict, rundir, first, rc, [first])
            verdict.fail("the first run ended before its first checkpoint (not exercised)")
            return
        second = self.launch(rundir, "second")
        rc2 = second.wait(self.timeout)
        if rc2 is None:
            second.kill9()
        errors = [line for line in second.lines if line.startswith("sparkpoint: error:")]
        first_alive = first.alive()
        verdict.injected = "second deployment " + ("refused" if rc2 not in (0, None) and errors else "NOT refused")
        rc = self.finish(first, verdict, "the first run")
        self.judge(verdict, rundir, first, rc, [first])
        ran = rc2 in (0, None) or " RUNNING epoch " in second.text or COMPLETED.search(second.text)
        if ran and not first_alive and not errors:
            verdict.injected = "nothing"
            verdict.fail("the first run finished before the second deployment started (not exercised)")
        elif ran:
            verdict.fail(f"the second deployment ran (exit code {rc2}); see {second.log}")
        elif len(errors) != 1 or not re.search(rf"held by .*pid {first.popen.pid}\b", errors[0]):
            verdict.fail(f"the second deployment was not refused with one error naming the running first run "
                         f"(pid {first.popen.pid}); see {second.log}")
        else:
            verdict.notes.append(errors[0].removeprefix("sparkpoint: error: ")[:160] + " ...")
        if not first_alive and rc != 0:
            verdict.fail("the first run died while the second deployment started")

    # ---- executor-kill: a Spark Python worker SIGKILLed while a savepoint is taken
    def _savepoint_request(self, rundir: Path) -> tuple[threading.Thread, dict[str, Any]]:
        """Ask the running job for a savepoint through its REST API, as `sparkpoint
        savepoint` does; the answer (location or error) lands in the returned dict."""
        from sparkpoint.ops.control_cli import call, locate, wait_for

        answer: dict[str, Any] = {}

        def ask() -> None:
            try:
                running = locate(self.checkpoint_dir(rundir), self.job_name, self.storage_options or None)
                request_id = call(running, "POST", "/savepoints", {})["request-id"]
                answer["location"] = wait_for(running, f"/savepoints/{request_id}", self.timeout,
                                              gone_ok=True).get("location")
            except Exception as e:  # noqa: BLE001 - a failed savepoint is an outcome, reported as such
                answer["error"] = f"{type(e).__name__}: {e}"

        thread = threading.Thread(target=ask, daemon=True, name="chaos-savepoint")
        thread.start()
        return thread, answer

    def _kill_worker_in_savepoint(self, run: Run, rundir: Path) -> str | None:
        """Trigger a savepoint and SIGKILL the run's Python workers once its barrier is
        triggered (a seeded moment up to 0.4 s later). What was done, or None if the run
        ended or no worker was there to kill."""
        start = len(run.lines)
        failovers_before = run.count(re.compile(r"job status RUNNING -> FAILING"))
        thread, answer = self._savepoint_request(rundir)
        trigger = None
        deadline = time.monotonic() + self.timeout
        while trigger is None and run.alive() and time.monotonic() < deadline and "error" not in answer:
            with run._cond:
                trigger = next((m for m in map(TRIGGERED_FORCED.search, run.lines[start:]) if m), None)
                if trigger is None:
                    run._cond.wait(0.1)
        if trigger is None:
            thread.join(5)
            return None
        time.sleep(self.rng.uniform(0.0, 0.4))
        savepoint_done = re.compile(rf"savepoint {trigger.group(1)} of job .* completed")
        completed_first = savepoint_done.search("\n".join(run.lines[start:]))
        # Idle workers (Spark keeps them for reuse) die without a trace: keep killing
        # until the savepoint is answered or the job fails over, so a busy one is hit.
        killed: set[int] = set()
        failover = re.compile(r"job status RUNNING -> FAILING")
        until = time.monotonic() + 60
        while run.alive() and time.monotonic() < until:
            for pid in python_workers(run.popen.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            if answer or not thread.is_alive() or run.count(failover) > failovers_before:
                break
            time.sleep(0.2)
        thread.join(self.timeout)
        if not killed:
            return None
        failed_over = run.count(failover) > failovers_before
        outcome = ("savepoint completed" if answer.get("location") else
                   f"savepoint failed ({answer.get('error', 'no answer')[:80]})")
        when = "after it completed" if completed_first else "while it was taken"
        return (f"{len(killed)} Python worker(s) SIGKILLed {when} (savepoint {trigger.group(1)}); {outcome}"
                + ("; the job failed over" if failed_over else ""))

    def _executor_kill(self, rundir: Path, verdict: Verdict) -> None:
        run = self.launch(rundir, "run")
        done = None
        if run.wait_for(COMPLETED, self.timeout) is not None and run.wait(self.rng.uniform(0.0, 0.3) * self.span) is None:
            done = self._kill_worker_in_savepoint(run, rundir)
        rc = self.finish(run, verdict, "the run")
        verdict.injected = done or "nothing"
        self.judge(verdict, rundir, run, rc, [run])
        if done is None:
            verdict.fail("no Python worker was SIGKILLed during a savepoint: the run ended first (not exercised)")

    # ---- restore-outage: SIGKILL, then storage fails for 3 s while the rerun restores
    @staticmethod
    def restore_outage_rules(window_file: Path) -> list[dict[str, Any]]:
        """Every read of a state file fails for RESTORE_OUTAGE_S from the first one, in
        every process of the run (`window_file` holds the start): state files are read
        only when a subtask restores or rebuilds its state, so the outage meets the
        restore, however long Spark takes to start."""
        return [{"op": "read", "path": "*/shared/**", "action": "fail", "duration": RESTORE_OUTAGE_S,
                 "window_file": str(window_file)}]

    def _restore_outage(self, rundir: Path, verdict: Verdict) -> None:
        first = self.launch(rundir, "run")
        killed = False
        if first.wait_for(COMPLETED, self.timeout) is not None:
            if first.wait(self.rng.uniform(0.0, 0.3) * self.span) is None:
                first.kill9()
                killed = True
        if not killed:
            rc = self.finish(first, verdict, "the run")
            verdict.injected = "nothing"
            self.judge(verdict, rundir, first, rc, [first])
            verdict.fail("the run finished before its kill: no restore to disturb (not exercised)")
            return
        # The rerun comes up as on a new host, without the local state: it restores from
        # checkpoint storage, where the outage is.
        shutil.rmtree(rundir / "state", ignore_errors=True)
        rules = self.restore_outage_rules(rundir / "restore-outage.window")
        rerun = self.launch(rundir, "rerun", [f"sparkpoint.faults={json.dumps(rules)}"])
        rc = self.finish(rerun, verdict, "the rerun")
        fired = rerun.count(re.compile(r"injected fault: read of "))
        verdict.injected = f"SIGKILL, then state reads fail for {RESTORE_OUTAGE_S:g} s during restore ({fired} failed)"
        self.judge(verdict, rundir, rerun, rc, [first, rerun])
        verdict.restarts += 1
        if not fired:
            verdict.fail("the rerun never reported a failed read: the outage did not meet the restore "
                         "(not exercised)")

    # ---- storm: every fault once per seed, all in one job
    def _storm(self, rundir: Path) -> list[Verdict]:
        """One job, one segment (process) per seed; each segment gets every chosen fault
        once: it starts into a storage outage during restore (not the first), rides out
        a checkpoint-storage outage, refuses a second deployment, loses a Python worker
        in the middle of a savepoint, and is SIGKILLed at a random moment (with its
        newest checkpoint damaged for `corrupt`). A last segment runs to the end. The
        committed output, compared once, is every injection's verdict."""
        verdicts: list[Verdict] = []
        runs: list[Run] = []
        self._local.runs = []
        fs, layout = self.storage(rundir)
        last_id = 0
        extra_base = [] if self.settings.num_retained >= 2 else ["execution.checkpointing.num-retained=2"]
        for i, seed in enumerate([*self.seeds, None]):
            self._local.rng = rng = random.Random(f"{seed}:storm")
            mine = {f: Verdict(f, seed if seed is not None else self.seeds[-1], directory=str(rundir), passed=True)
                    for f in self.faults}
            rules: list[dict[str, Any]] = []
            if "outage" in mine and seed is not None:
                n = min(2, max(1, self.settings.tolerable_failed_checkpoints))
                first_id = last_id + rng.choice((2, 3))
                ids = list(range(first_id, first_id + n))
                rules += [{"op": op, "path": "*", "checkpoints": ids, "action": "fail"}
                          for op in ("mkdir", "create_exclusive", "write", "upload")]
                mine["outage"].injected = f"storage fails for checkpoints {ids[0]}-{ids[-1]}"
            if "restore-outage" in self.faults and i > 0:
                rules += self.restore_outage_rules(rundir / f"restore-outage-{i}.window")
            run = self.launch(rundir, f"segment-{i}", [*extra_base, f"sparkpoint.faults={json.dumps(rules)}"],
                              faults_done=seed is None)
            runs.append(run)
            if i > 0:
                started = run.wait_for(re.compile(r" RUNNING epoch |job \S+ (FINISHED|FAILED)"), self.timeout)
                past_restore = started is not None and "FAILED" not in started.group(0)
                if "restore-outage" in self.faults:
                    prev = verdicts_by(verdicts, "restore-outage", self.seeds[i - 1])
                    failed_reads = run.count(re.compile("injected fault: read of "))
                    landed = prev.injected == "SIGKILL"  # the segment's kill landed
                    if landed:
                        prev.injected = (f"SIGKILL, then state reads fail for {RESTORE_OUTAGE_S:g} s during "
                                         f"restore ({failed_reads} failed reads)")
                    if not past_restore:
                        prev.fail(f"segment {i} did not get past its restore: see {run.log}")
                    elif landed and not failed_reads:
                        prev.fail("no state read failed: the outage did not meet the restore (not exercised)")
                if "corrupt" in self.faults:
                    prev = verdicts_by(verdicts, "corrupt", self.seeds[i - 1])
                    damaged = re.search(r"of chk-(\d+) damaged", prev.injected)
                    if damaged and past_restore and not re.search(
                            rf"(skipping chk-{damaged.group(1)}:|ALARM checkpoint {damaged.group(1)} of job .* "
                            rf"is corrupt)", run.text):
                        prev.fail(f"segment {i} did not report chk-{damaged.group(1)} as corrupt and fall back "
                                  f"to an older checkpoint; see {run.log}")
            if seed is None:
                break
            self.echo(f"chaos: storm segment {i} (seed {seed})")
            if not self._storm_segment(run, rundir, fs, layout, mine, rng):
                verdicts += mine.values()
                break
            verdicts += mine.values()
            last_id = max([last_id, *[int(x) for x in re.findall(r"completed checkpoint (\d+) of job", run.text)],
                           *[int(x) for x in re.findall(r"triggering checkpoint (\d+) ", run.text)]])
        last = runs[-1]
        rc = self.finish(last, None, "the last segment")
        final = Verdict("storm", self.seeds[-1], directory=str(rundir), passed=True)
        self.judge(final, rundir, last, rc, runs)
        final.restarts += len(runs) - 1  # the segments started again after a kill
        for v in verdicts:
            v.lost, v.duplicated, v.unexpected, v.committed = final.lost, final.duplicated, final.unexpected, final.committed
            v.restarts = final.restarts
            if not final.passed:
                v.fail("the job's committed output differs or it did not finish: " + "; ".join(final.notes))
        return verdicts

    @staticmethod
    def _completed_quietly(fs, layout) -> dict[int, Any]:
        try:
            return _completed(fs, layout)
        except Exception:  # noqa: BLE001 - a checkpoint subsumed while we read it: look again
            return {}

    def _storm_segment(self, run: Run, rundir: Path, fs, layout, mine: dict[str, Verdict],
                       rng: random.Random) -> bool:
        """The in-run faults of one segment, then the kill that ends it. False if the job
        finished before every fault of the segment was injected."""
        def not_exercised(fault: str, why: str) -> None:
            if fault in mine:
                mine[fault].injected = mine[fault].injected or "nothing"
                mine[fault].fail(f"{why} (not exercised)")

        if run.wait_for(COMPLETED, self.timeout) is None:
            for f in mine:
                not_exercised(f, "the segment ended before its first checkpoint")
            return False
        if "outage" in mine:
            ids = [int(x) for x in re.findall(r"\d+", mine["outage"].injected.split("checkpoints ")[1])]
            after = re.compile(rf"completed checkpoint (\d+) of job")
            deadline = time.monotonic() + self.timeout
            while run.alive() and time.monotonic() < deadline and not any(
                    int(m.group(1)) > ids[-1] for m in map(after.search, run.lines[:]) if m):
                time.sleep(0.2)
            failed = run.count(re.compile(rf"checkpoint ({'|'.join(map(str, range(ids[0], ids[-1] + 1)))}) of job "
                                          rf"\S+ (failed|is declined|expired)|injected fault"))
            # Restarts while the outage lasted: from its first checkpoint's first line to the
            # next completed one (a restart before, while restoring, is another fault's).
            lines = list(run.lines)
            first = re.compile(rf"checkpoint {ids[0]}\b")
            began = next((n for n, line in enumerate(lines) if first.search(line)), None)
            ended = next((n for n, line in enumerate(lines) if began is not None and n > began
                          and (m := after.search(line)) and int(m.group(1)) > ids[-1]), len(lines))
            if began is not None and any(RESTARTING.search(line) for line in lines[began:ended]):
                mine["outage"].fail("the job restarted during the checkpoint-storage outage")
            if not run.alive():
                not_exercised("outage", "the job finished before the outage's checkpoints")
            elif not failed:
                mine["outage"].notes.append("no failure of the outage's checkpoints was logged")
        if "second" in mine and run.alive():
            second = self.launch(rundir, f"second-{mine['second'].seed}")
            rc2 = second.wait(self.timeout)
            errors = [line for line in second.lines if line.startswith("sparkpoint: error:")]
            refused = rc2 not in (0, None) and len(errors) == 1 and " RUNNING epoch " not in second.text
            mine["second"].injected = "second deployment " + ("refused" if refused else "NOT refused")
            if not refused and run.alive():
                mine["second"].fail(f"the second deployment was not refused with one error; see {second.log}")
            elif not refused:
                not_exercised("second", "the job finished before the second deployment")
        if "executor-kill" in mine:
            done = self._kill_worker_in_savepoint(run, rundir) if run.alive() else None
            mine["executor-kill"].injected = done or "nothing"
            if done is None:
                not_exercised("executor-kill", "no Python worker was SIGKILLed during a savepoint")
            elif run.wait_for(COMPLETED, self.timeout) is None:
                pass  # judged at the end
        kill = {f for f in ("kill9", "corrupt", "restore-outage") if f in mine}
        if not kill:
            return run.alive()
        if not run.alive():
            for f in kill:
                not_exercised(f, "the job finished before the segment's kill")
            return False
        if "corrupt" in mine:
            # Falling back needs an older checkpoint: wait for two (a failover above may
            # have left only one since the restore).
            deadline = time.monotonic() + self.timeout
            while run.alive() and time.monotonic() < deadline and len(self._completed_quietly(fs, layout)) < 2:
                time.sleep(0.3)
        run.wait(rng.uniform(0.0, 0.3) * self.span)
        if not run.alive():
            for f in kill:
                not_exercised(f, "the job finished before the segment's kill")
            return False
        run.signal(signal.SIGSTOP)  # frozen: what we see is what the kill leaves
        damaged = None
        if "corrupt" in mine:
            try:
                done = _completed(fs, layout)
                if len(done) >= 2:
                    latest, older = sorted(done)[-1], sorted(done)[-2]
                    only = _state_files_only_in(done, latest, older) if rng.random() < 0.5 else []
                    path = layout.resolve(only[-1]) if only else layout.metadata(latest)
                    _flip_bytes(fs, path)
                    damaged = f"{'state file' if only else '_metadata'} of chk-{latest} damaged"
            except Exception as e:  # noqa: BLE001 - reported as not exercised
                damaged = None
                mine["corrupt"].notes.append(f"could not damage a checkpoint: {type(e).__name__}: {e}")
        run.kill9()
        if "restore-outage" in mine:
            shutil.rmtree(rundir / "state", ignore_errors=True)  # the next segment restores from storage
        if "restore-outage" in mine:
            mine["restore-outage"].injected = "SIGKILL"
        if "kill9" in mine:
            mine["kill9"].injected = "SIGKILL"
        if "corrupt" in mine:
            if damaged:
                mine["corrupt"].injected = f"SIGKILL, {damaged}"
            else:
                not_exercised("corrupt", "fewer than two completed checkpoints at the kill")
        return True

    def run(self) -> Report:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.probe()
            reference = self.reference()
            if self.storm:
                verdicts = self._storm(self.workdir / "storm")
            else:
                work = [(fault, seed) for seed in self.seeds for fault in self.faults]
                if self.parallel == 1:
                    verdicts = [self.scenario(fault, seed) for fault, seed in work]
                else:
                    from concurrent.futures import ThreadPoolExecutor

                    with ThreadPoolExecutor(self.parallel, thread_name_prefix="chaos") as pool:
                        verdicts = list(pool.map(lambda w: self.scenario(*w), work))
        finally:
            self.cleanup()
        storage = self.checkpoint_base.split("://")[0] if self.checkpoint_base and "://" in self.checkpoint_base \
            else "local"
        report = Report(os.path.relpath(self.pipeline_file), self.seed, str(self.workdir), reference, verdicts,
                        sink=self.output.kind, storage=storage)
        (self.workdir / "chaos-report.md").write_text(report.render() + "\n")
        return report


def verdicts_by(verdicts: list[Verdict], fault: str, seed: int) -> Verdict:
    return next(v for v in verdicts if v.fault == fault and v.seed == seed)


# -- the command -----------------------------------------------------------------------

def _faults(value: str) -> list[str]:
    names = [f.strip() for f in value.split(",") if f.strip()]
    bad = [f for f in names if f not in FAULTS]
    if bad or not names:
        raise click.BadParameter(f"{', '.join(bad) or value!r}: choose from {','.join(FAULTS)}")
    return list(dict.fromkeys(names))


@click.command()
@click.argument("pipeline_file")
@click.option("--config", "config_file", type=click.Path(), help="YAML file of configuration keys (every run)")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="override a configuration key (every run)")
@click.option("--faults", "faults", default=",".join(FAULTS), show_default=True,
              help="comma-separated faults to inject, one faulty run each (per seed)")
@click.option("--seed", default=None, type=int, help="first seed for the kill moments and choices (default: random)")
@click.option("--seeds", default=1, show_default=True, type=click.IntRange(1, 1000),
              help="run every fault with this many seeds: --seed, --seed+1, ...")
@click.option("--storm", is_flag=True,
              help="one job for everything: each seed injects every fault once into the same job")
@click.option("--kills", default=None, type=click.IntRange(1, 10),
              help="SIGKILLs of the kill9 fault (default: 2 or 3, seeded)")
@click.option("--checkpoint-dir", "checkpoint_base", default=None, metavar="URL",
              help="put the runs' checkpoints under URL (e.g. s3://bucket/chaos; storage options from "
                   "execution.checkpointing.storage-options) instead of the work directory")
@click.option("--workdir", default=None, type=click.Path(file_okay=False),
              help="where the runs' checkpoints, state, output, logs and chaos-report.md go "
                   "(default: a new temporary directory)")
@click.option("--parallel", default=1, show_default=True, type=click.IntRange(1, 8),
              help="faulty runs at a time (each is a Spark application of its own)")
@click.option("--timeout", default=900, show_default=True, type=float, help="seconds one run may take")
@click.option("--json", "as_json", is_flag=True, help="the verdicts as JSON")
def chaos(pipeline_file: str, config_file: str | None, sets: tuple[str, ...], faults: str, seed: int | None,
          seeds: int, storm: bool, kills: int | None, checkpoint_base: str | None, workdir: str | None,
          parallel: int, timeout: float, as_json: bool) -> None:
    """Run a bounded pipeline without faults and under each fault; compare committed output row for row.

    Faults: kill9 (SIGKILL at random moments), outage (checkpoint storage fails for a
    few checkpoints), corrupt (the newest checkpoint damaged after a kill), second (a
    second deployment on the same checkpoint directory), executor-kill (a Python worker
    SIGKILLed during a savepoint), restore-outage (storage fails for 3 s during restore).
    Exit code 0 only if every faulty run passes: nothing lost, nothing duplicated, and
    the fault behaved as documented. The pipeline must be bounded and write to a
    ParquetSink or DeltaSink with a relative path (or one built from
    $SPARKPOINT_CHAOS_RUN_DIR), or to a KafkaSink. The report is also written to
    WORKDIR/chaos-report.md. See docs/chaos.md.
    """
    names = _faults(faults)
    if not Path(pipeline_file).exists():
        raise ChaosError(f"pipeline file {pipeline_file} does not exist")
    seed = seed if seed is not None else random.SystemRandom().randrange(1_000_000)
    work = Path(workdir).resolve() if workdir else Path(tempfile.mkdtemp(prefix="sparkpoint-chaos-"))
    echo = (lambda s: click.echo(s, err=True))
    report = Chaos(pipeline_file, config_file, sets, names, seed, work, timeout, kills, parallel, echo,
                   seeds=seeds, storm=storm, checkpoint_base=checkpoint_base).run()
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.render())
    sys.exit(0 if report.ok else 1)


def register(cli: click.Group) -> None:
    cli.add_command(chaos)
