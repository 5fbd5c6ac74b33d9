"""Every Nexmark example (examples/nexmark/qN.py), `kill -9`ed mid-run and run again to
the end, against an independent oracle: its committed output must equal what the pandas
reference (tests/nexmark/reference.py) computes from the same events, row for row.

    python scripts/nexmark_kill9.py [--events 100000] [--queries q0,q3,...] [--kills 1]
                                    [--workdir DIR] [--seed N] [--json FILE]
    make nexmark-kill9                      # the same, every query

What runs is `sparkpoint chaos`'s kill9 fault (sparkpoint.ops.chaos.Chaos, the CLI's own
machinery) with the oracle's rows in place of a fault-free run: each example is started
as a real `sparkpoint run` process on the generated input (NEXMARK_INPUT), SIGKILLed
(the whole process group: driver, JVM, Python workers) at a seeded moment of its
processing, and started again until it finishes. The verdict counts rows lost and
duplicated against the oracle.

Queries whose result updates (q4, q15-q17, q18, q19: a changelog, one row per changed key and
epoch) are compared by their result: per key the row of the latest epoch, as
tests/nexmark/test_examples.py reads them; a key written twice in one epoch counts as
duplicated. Every other query appends, so every committed row is a result row.

q12 counts bids in windows of processing time, which belongs to the run: its oracle is
the reference given the processing times the committed result shows
(tests/nexmark/processing_time.py), which must put every input file's bids whole in one
window, the files' windows in file order, every bid counted once; a result that no
processing times could give fails with the reason.

Needs the repository's tests/ on the path (run from the repository root). Too slow for
`make test` (a Spark start per run, two or more runs per query).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from sparkpoint.ops.chaos import Chaos, Run  # noqa: E402
from tests.nexmark import processing_time, reference  # noqa: E402
from tests.nexmark.rows import row_counts  # noqa: E402
from tests.nexmark.test_examples import EXPRESSIBLE, PROCESSING_TIME, UPDATING, sink_columns  # noqa: E402

EPOCH = re.compile(r"RUNNING epoch (\d+)")
COMPLETED = re.compile(r"completed checkpoint (\d+) of job")
RESTORED = re.compile(r"restor\w* (?:from )?checkpoint (\d+)", re.IGNORECASE)


def result_rows(query: str, committed: pd.DataFrame, columns: list[str]) -> tuple[Counter, int]:
    """The query's result rows from its committed output, and the rows of keys written
    more than once in one epoch (an updating query's changelog has one row per changed key
    and epoch; a second one is a duplicate)."""
    key = UPDATING.get(query)
    if key is None:
        return row_counts(committed[columns]), 0
    twice = committed.duplicated(["epoch", *key], keep="first")
    latest = committed.sort_values("epoch", kind="stable").drop_duplicates(key, keep="last")
    return row_counts(latest[columns]), int(twice.sum())


class OracleChaos(Chaos):
    """chaos's kill9 fault, judged against the oracle's result instead of a fault-free run."""

    def __init__(self, query: str, columns: list[str], span: float, oracle_of_result=None, **kwargs):
        super().__init__(**kwargs)
        self.query, self.columns, self.oracle_span = query, columns, span
        self.twice_in_an_epoch = 0
        # A processing-time query's oracle depends on the run: made from its committed result.
        self.oracle_of_result = oracle_of_result
        self.oracle_rows: int | None = None
        self.inconsistent: str | None = None

    def reference(self):
        info = super().reference()
        self.span = self.oracle_span  # seconds of processing the kill moments are drawn from
        return info

    def output_rows(self, rundir: Path) -> Counter:
        from sparkpoint.connectors.parquet_sink import read_committed

        path = rundir / self.output.where
        committed = read_committed(str(path)) if path.exists() else None
        if committed is None or not committed.num_columns:
            return Counter()
        frame = committed.to_pandas()
        if self.oracle_of_result is not None:
            try:
                expected = self.oracle_of_result(frame[self.columns])
            except processing_time.InconsistentResult as e:
                self.inconsistent, expected = str(e).splitlines()[0], frame.iloc[:0]
            self.expected, self.oracle_rows = row_counts(expected[self.columns]), len(expected)
        rows, twice = result_rows(self.query, frame, self.columns)
        self.twice_in_an_epoch = twice
        return rows


def _last(rx: re.Pattern, run: Run) -> int | None:
    found = [int(m.group(1)) for line in run.lines for m in [rx.search(line)] if m]
    return found[-1] if found else None


def read_at(events: reference.Events, input_dir: Path):
    """q12's oracle of a run's result: the reference given the processing times it shows."""
    files = processing_time.rows_per_file(str(input_dir / "bid"))

    def oracle(result: pd.DataFrame) -> pd.DataFrame:
        times = processing_time.processing_times(events.bid.bidder, files, result)
        return reference.QUERIES["q12"](reference.Events(events.person, events.auction,
                                                         events.bid.assign(p_time=times), events.side_input))
    return oracle


def run_query(query: str, events: reference.Events, args, input_dir: Path, workdir: Path) -> dict:
    oracle_of_result = read_at(events, input_dir) if query in PROCESSING_TIME else None
    if oracle_of_result is None:
        expected_frame = reference.QUERIES[query](events)
        columns, expected, rows_expected = list(expected_frame.columns), row_counts(expected_frame), len(expected_frame)
    else:  # its rows once the run's result is in
        columns, expected, rows_expected = [name for name, _ in sink_columns(query)], Counter(), None
    chaos = OracleChaos(query, columns, args.span, oracle_of_result=oracle_of_result,
                        pipeline_file=str(REPO / "examples" / "nexmark" / f"{query}.py"),
                        config_file=None, sets=tuple(args.set), faults=["kill9"], seed=args.seed,
                        workdir=workdir / query, timeout=args.timeout, kills=args.kills,
                        echo=lambda s: print(f"[{query}] {s}", file=sys.stderr, flush=True),
                        expected=expected)
    began = time.monotonic()
    report = chaos.run()
    verdict = report.verdicts[0]
    killed = [r for r in chaos.runs if r.popen.returncode == -9]
    kills = [{"epoch": _last(EPOCH, r), "checkpoint": _last(COMPLETED, r)} for r in killed]
    last = chaos.runs[-1] if chaos.runs else None
    duplicated = (verdict.duplicated or 0) + chaos.twice_in_an_epoch
    passed = verdict.passed and not chaos.twice_in_an_epoch
    notes = list(verdict.notes)
    if chaos.inconsistent:
        notes.append(f"no processing times give this result: {chaos.inconsistent}")
    if oracle_of_result is not None:
        rows_expected = chaos.oracle_rows
    return {"query": query, "rows_expected": rows_expected, "result_rows": verdict.committed,
            "lost": verdict.lost, "duplicated": duplicated, "unexpected": verdict.unexpected,
            "twice_in_an_epoch": chaos.twice_in_an_epoch, "kills": kills,
            "restored_from": _last(RESTORED, last) if last else None,
            "updating": query in UPDATING, "verdict": "PASS" if passed else "FAIL", "notes": notes,
            "seconds": round(time.monotonic() - began, 1), "directory": verdict.directory}


def generate(input_dir: Path, args) -> None:
    if (input_dir / "bid").is_dir():
        return
    subprocess.run([sys.executable, "-m", "sparkpoint.ops.cli", "nexmark", "generate", "--events", str(args.events),
                    "--out", str(input_dir), "--seed", str(args.seed), "--rate", str(args.rate), "--files-per-stream",
                    str(args.files_per_stream)], check=True)


def render(results: list[dict], args) -> str:
    lines = [f"kill -9 per Nexmark query: {args.events:,} events at {args.rate:g}/s, "
             f"{args.files_per_stream} files per stream, "
             f"{args.files_per_epoch} per epoch, seed {args.seed}", "",
             "| query | killed mid-run (epoch / last completed checkpoint) | restored from | rows expected | lost "
             "| duplicated | unexpected | verdict | seconds |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        kills = ", ".join(f"epoch {k['epoch']} / chk {k['checkpoint']}" for k in r["kills"]) or "no"
        expected = "-" if r["rows_expected"] is None else f"{r['rows_expected']:,}"
        lines.append(f"| {r['query']} | {kills} | {r['restored_from']} | {expected} | {r['lost']} "
                     f"| {r['duplicated']} | {r['unexpected']} | {r['verdict']} | {r['seconds']:.0f} |")
    for r in results:
        for note in r["notes"]:
            lines.append(f"- {r['query']}: {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=1_000.0,
                        help="events per second of event time: 1000 makes 100,000 events span 100 s, ten of "
                             "q7's and q8's 10-second windows")
    parser.add_argument("--files-per-stream", type=int, default=20)
    parser.add_argument("--files-per-epoch", type=int, default=1)
    parser.add_argument("--queries", default=",".join(EXPRESSIBLE))
    parser.add_argument("--kills", type=int, default=1, help="SIGKILLs per query (each costs a Spark start)")
    parser.add_argument("--span", type=float, default=20.0,
                        help="a kill lands 5-60%% of this many seconds after the run's first epoch")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--set", action="append", default=["execution.checkpointing.interval=1s"])
    parser.add_argument("--parallel", type=int, default=1, help="queries run at a time")
    parser.add_argument("--json", default=None, help="also write the results as JSON lines here")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="nexmark-kill9-")).resolve()
    input_dir = workdir / "input"
    generate(input_dir, args)
    from sparkpoint.connectors.nexmark_io import write_side_input

    side = input_dir / "side_input.csv"
    if not side.exists():
        write_side_input(str(side))
    os.environ["NEXMARK_INPUT"] = str(input_dir)
    os.environ["NEXMARK_FILES_PER_EPOCH"] = str(args.files_per_epoch)
    for name in ("NEXMARK_OUTPUT", "NEXMARK_SIDE_INPUT"):
        os.environ.pop(name, None)
    events = reference.load(str(input_dir), side_input=str(side))
    queries = [q.strip() for q in args.queries.split(",") if q.strip()]

    def one(query: str) -> dict:
        try:
            result = run_query(query, events, args, input_dir, workdir)
        except Exception as e:  # noqa: BLE001 - one query's trouble is its verdict, not the others'
            result = {"query": query, "rows_expected": None, "result_rows": None, "lost": None, "duplicated": None,
                      "unexpected": None, "twice_in_an_epoch": 0, "kills": [], "restored_from": None,
                      "updating": query in UPDATING, "verdict": "FAIL",
                      "notes": [f"could not run: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"],
                      "seconds": 0.0, "directory": str(workdir / query)}
        print(json.dumps(result), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(result) + "\n")
        return result

    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        results = list(pool.map(one, queries))
    table = render(results, args)
    (workdir / "nexmark-kill9.md").write_text(table + "\n")
    print(table)
    print(f"runs, logs and input in {workdir}")
    return 0 if all(r["verdict"] == "PASS" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
