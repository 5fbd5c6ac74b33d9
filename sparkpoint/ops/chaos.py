"""`sparkpoint chaos PIPELINE.py`: run a bounded pipeline once without faults and once
per injected fault, and compare the committed outputs row for row.

    sparkpoint chaos PIPELINE.py [--config FILE] [--set key=value ...]
                     [--faults kill9,outage,corrupt,second] [--seed N] [--workdir DIR] [--json]

Every run is a real `sparkpoint run PIPELINE.py` process (its own process group) in its
own directory under the work directory: `--set` gives it a private checkpoint directory
and state directory, and it runs with that directory as its working directory, so a
relative sink path (the demo's `sparkpoint-demo/output`) lands there too. A pipeline
whose sink path is absolute can read the run's directory from the environment variable
SPARKPOINT_CHAOS_RUN_DIR instead. The faults (docs/chaos.md):

  kill9    SIGKILL the process group at 2-3 random moments (seeded); rerun until it finishes
  outage   checkpoint storage fails for a few checkpoints (sparkpoint.faults); no restart allowed
  corrupt  SIGKILL, then damage the newest completed checkpoint (its `_metadata` or a state
           file only it references); the rerun must fall back to an older checkpoint
  second   a second deployment on the same checkpoint directory while the first runs: it
           must be refused with one clear error, and the first must be unaffected

The verdict compares each faulty run's committed output with the fault-free run's as
multisets of rows (the sink's `epoch` column is left out: where epochs begin depends on
timing, the rows do not): lost = rows missing, duplicated = rows committed too often.
"""

from __future__ import annotations

import json
import os
import random
import re
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

FAULTS = ("kill9", "outage", "corrupt", "second")
RUN_DIR_ENV = "SPARKPOINT_CHAOS_RUN_DIR"
COMPLETED = re.compile(r"completed checkpoint (\d+) of job")
SUMMARY = re.compile(r"^job (\S+) (\w+): (\d+) epochs, .* (\d+) checkpoints completed, (\d+) failed, (\d+) restarts")
OUTPUT_LINE = re.compile(r"^\s*exactly-once output : (\S+)")
RESTARTING = re.compile(r"job status \w+ -> RESTARTING")
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

    def tail(self, n: int = 15) -> str:
        with self._cond:
            return "\n".join(self.lines[-n:])


# -- comparing committed output --------------------------------------------------------

def committed_rows(path: str, drop: tuple[str, ...] = DROPPED_COLUMNS) -> Counter:
    """The committed output (exactly the files the sink's log lists, as Spark reads them)
    as a multiset of rows, without the columns in `drop`."""
    from sparkpoint.connectors.parquet_sink import read_committed

    if not os.path.exists(path):
        return Counter()
    table = read_committed(path)
    cols = sorted(c for c in table.column_names if c not in drop)
    return Counter(tuple(row[c] for c in cols) for row in table.select(cols).to_pylist())


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


def _flip_bytes(path: str, at: int = 0) -> None:
    """Bit rot: 16 bytes flipped, size unchanged."""
    with open(path, "r+b") as f:
        f.seek(at)
        data = bytearray(f.read(16))
        f.seek(at)
        f.write(bytes(b ^ 0x5A for b in data))
        f.flush()
        os.fsync(f.fileno())


# -- the verdicts ----------------------------------------------------------------------

@dataclass
class Verdict:
    fault: str
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

    @property
    def ok(self) -> bool:
        return bool(self.verdicts) and all(v.passed for v in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "seed": self.seed, "workdir": self.workdir, "ok": self.ok,
                "reference": self.reference, "faults": [asdict(v) for v in self.verdicts]}

    def render(self) -> str:
        ref = self.reference
        head = ["fault", "injected", "restarts", "lost", "duplicated", "verdict"]
        rows = [[v.fault, v.injected, str(v.restarts), _num(v.lost),
                 _num(v.duplicated) + (f" (+{v.unexpected} unexpected)" if v.unexpected else ""),
                 "PASS" if v.passed else "FAIL"] for v in self.verdicts]
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
        out = [f"sparkpoint chaos {self.pipeline} (seed {self.seed})",
               f"fault-free run: {ref['rows']:,} committed rows in {ref['seconds']:.0f} s", "",
               line(head), line(["-" * w for w in widths]), *map(line, rows), ""]
        for v in self.verdicts:
            for note in v.notes:
                out.append(f"  {v.fault}: {note}")
        out.append(f"{'PASS' if self.ok else 'FAIL'}: {sum(v.passed for v in self.verdicts)} of "
                   f"{len(self.verdicts)} faults passed; runs and logs in {self.workdir}")
        return "\n".join(out)


def _num(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


# -- the chaos run ---------------------------------------------------------------------

class Chaos:
    def __init__(self, pipeline_file: str, config_file: str | None, sets: tuple[str, ...], faults: list[str],
                 seed: int, workdir: Path, timeout: float, kills: int | None, parallel: int = 1,
                 echo: Callable[[str], None] = lambda s: None):
        self.pipeline_file = str(Path(pipeline_file).resolve())
        self.config_file = str(Path(config_file).resolve()) if config_file else None
        self.user_sets = list(sets)
        self.faults = faults
        self.seed = seed
        self.workdir = workdir
        self.timeout = timeout
        self.kills = kills
        self.parallel = max(1, parallel)
        self.echo = echo
        self.runs: list[Run] = []
        self._local = threading.local()  # the current fault's runs and random numbers

    @property
    def rng(self) -> random.Random:
        return self._local.rng

    # ---- set-up
    def probe(self) -> None:
        """Load the pipeline and its settings here (no Spark) to learn the job name and
        where its sink writes: that location must move with the run's directory."""
        from sparkpoint.config import Settings
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
        sink = pipeline.sink_
        if not isinstance(sink, ParquetSink):
            raise ChaosError(f"sparkpoint chaos compares Parquet output; the sink of {self.pipeline_file} is a "
                             f"{type(sink).__name__}")
        path = os.path.realpath(sink.path) if "://" not in sink.path else sink.path
        root = os.path.realpath(probe)
        if "://" in path or os.path.commonpath([path, root]) != root:
            raise ChaosError(
                f"the sink writes to {sink.path}, which every run would share. Give ParquetSink a relative path "
                f"(each run's directory is its working directory) or build it from the environment variable "
                f"{RUN_DIR_ENV}, e.g. ParquetSink(os.environ.get('{RUN_DIR_ENV}', '.') + '/out')")
        self.output_rel = os.path.relpath(path, root)
        self.job_name = self.settings.job_name

    def command(self, rundir: Path, extra: list[str]) -> list[str]:
        sets = [*self.user_sets,
                f"execution.checkpointing.dir={rundir / 'checkpoints'}",
                f"state.local.dir={rundir / 'state'}",
                "rest.port=0",                 # runs side by side must not fight over 8081
                "sparkpoint.progress=true",    # the `RUNNING epoch` lines time the kills
                "sparkpoint.faults=[]",        # a config's rehearsal rules never reach the fault-free run
                *extra]
        cmd = [sys.executable, "-m", "sparkpoint.ops.cli", "--log-level", "INFO", "run", self.pipeline_file]
        if self.config_file:
            cmd += ["--config", self.config_file]
        for s in sets:
            cmd += ["--set", s]
        return cmd

    def launch(self, rundir: Path, name: str, extra: list[str] | None = None) -> Run:
        rundir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable))
        env[RUN_DIR_ENV] = str(rundir)
        run = Run(self.command(rundir, extra or []), rundir, env, rundir / f"{name}.log")
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

    def output_of(self, rundir: Path) -> str:
        return str(rundir / self.output_rel)

    def cleanup(self) -> None:
        for run in self.runs:
            if run.alive():
                run.kill9()

    # ---- the fault-free run
    def reference(self) -> dict[str, Any]:
        rundir = self.workdir / "reference"
        self.echo(f"chaos: fault-free run in {rundir}")
        run = self.launch(rundir, "run")
        rc = self.finish(run, None, "the fault-free run")
        summary = run.summary()
        if rc != 0 or not summary or summary["status"] != "FINISHED":
            raise ChaosError(f"the fault-free run did not finish (exit code {rc}); see {run.log}:\n{run.tail()}")
        self.expected = committed_rows(self.output_of(rundir))
        if not self.expected:
            raise ChaosError(f"the fault-free run committed no rows to {self.output_of(rundir)}: nothing to compare")
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
            verdict.fail(f"the last run ended with exit code {rc}, not FINISHED; see {last.log}")
        got = committed_rows(self.output_of(rundir))
        diff = compare(self.expected, got)
        verdict.lost, verdict.duplicated = diff["lost"], diff["duplicated"]
        verdict.unexpected, verdict.committed = diff["unexpected"], diff["committed"]
        if diff["lost"] or diff["duplicated"] or diff["unexpected"]:
            verdict.fail(f"committed {diff['committed']:,} rows, the fault-free run {diff['expected']:,}")

    def scenario(self, fault: str) -> Verdict:
        rundir = self.workdir / fault
        verdict = Verdict(fault, directory=str(rundir), passed=True)
        # Each fault draws from its own generator: the same seed gives the same moments
        # and choices whichever faults run, and in whichever order.
        self._local.rng = random.Random(f"{self.seed}:{fault}")
        self._local.runs = []
        began = time.monotonic()
        self.echo(f"chaos: {fault} in {rundir}")
        try:
            getattr(self, f"_{fault}")(rundir, verdict)
        except ChaosError as e:
            verdict.fail(e.message)
        except Exception as e:  # noqa: BLE001 - one fault's harness trouble is its verdict, not the others'
            verdict.fail(f"chaos could not carry out this fault: {type(e).__name__}: {e}")
        finally:
            for run in self._local.runs:
                if run.alive():
                    run.kill9()
        verdict.seconds = round(time.monotonic() - began, 1)
        self.echo(f"chaos: {fault}: {'PASS' if verdict.passed else 'FAIL'} ({verdict.seconds:.0f} s)")
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
        from sparkpoint.storage.fs import StorageFS
        from sparkpoint.storage.layout import JobLayout

        extra = []
        if self.settings.num_retained < 2:
            extra = ["execution.checkpointing.num-retained=2"]
            verdict.notes.append("ran with execution.checkpointing.num-retained=2: falling back needs an older one")
        fs = StorageFS.from_url(str(rundir / "checkpoints"))
        layout = JobLayout(f"{fs.root}/{self.job_name}")
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
        _flip_bytes(path, at=0)
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

    def run(self) -> Report:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.probe()
            reference = self.reference()
            if self.parallel == 1:
                verdicts = [self.scenario(fault) for fault in self.faults]
            else:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(self.parallel, thread_name_prefix="chaos") as pool:
                    verdicts = list(pool.map(self.scenario, self.faults))
        finally:
            self.cleanup()
        return Report(os.path.relpath(self.pipeline_file), self.seed, str(self.workdir), reference, verdicts)


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
              help="comma-separated faults to inject, one faulty run each")
@click.option("--seed", default=None, type=int, help="seed for the kill moments and choices (default: random)")
@click.option("--kills", default=None, type=click.IntRange(1, 10),
              help="SIGKILLs of the kill9 fault (default: 2 or 3, seeded)")
@click.option("--workdir", default=None, type=click.Path(file_okay=False),
              help="where the runs' checkpoints, state, output and logs go (default: a new temporary directory)")
@click.option("--parallel", default=1, show_default=True, type=click.IntRange(1, len(FAULTS)),
              help="faulty runs at a time (each is a Spark application of its own)")
@click.option("--timeout", default=900, show_default=True, type=float, help="seconds one run may take")
@click.option("--json", "as_json", is_flag=True, help="the verdicts as JSON")
def chaos(pipeline_file: str, config_file: str | None, sets: tuple[str, ...], faults: str, seed: int | None,
          kills: int | None, workdir: str | None, parallel: int, timeout: float, as_json: bool) -> None:
    """Run a bounded pipeline without faults and under each fault; compare committed output row for row.

    Faults: kill9 (SIGKILL at random moments), outage (checkpoint storage fails for a
    few checkpoints), corrupt (the newest checkpoint damaged after a kill), second (a
    second deployment on the same checkpoint directory). Exit code 0 only if every fault
    passes: nothing lost, nothing duplicated, and the fault behaved as documented.
    The pipeline must be bounded and write to a ParquetSink with a relative path (or one
    built from $SPARKPOINT_CHAOS_RUN_DIR). See docs/chaos.md.
    """
    names = _faults(faults)
    if not Path(pipeline_file).exists():
        raise ChaosError(f"pipeline file {pipeline_file} does not exist")
    seed = seed if seed is not None else random.SystemRandom().randrange(1_000_000)
    work = Path(workdir).resolve() if workdir else Path(tempfile.mkdtemp(prefix="sparkpoint-chaos-"))
    echo = (lambda s: click.echo(s, err=True))
    report = Chaos(pipeline_file, config_file, sets, names, seed, work, timeout, kills, parallel, echo).run()
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.render())
    sys.exit(0 if report.ok else 1)


def register(cli: click.Group) -> None:
    cli.add_command(chaos)
