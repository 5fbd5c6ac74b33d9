"""A real pipeline process writing a Delta table is SIGKILLed
twice (once right after a checkpoint completed, while its Delta commit may or may not
have happened, once at a random moment), restarted each time, and the table, read with
delta-rs, holds exactly the rows the input alone says it must (tests/e2e/chaos_oracles.py;
no failure-free reference job): nothing lost, nothing duplicated. Then the same job
merging its updates by key (one row per key, its final totals), and once more with the
table on an S3 API."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.e2e.chaos_oracles import aggregate_updates, as_canonical
from tests.e2e.delta_job import delta_pipeline, read_delta
from tests.e2e.harness import Job, canonical

pytestmark = [pytest.mark.e2e, pytest.mark.spark]

# 12 epochs of 2,000 events: long enough for two kills, short enough for a 2-core box.
SHAPE = dict(name="delta-e2e", keys=50, total=24_000, per_epoch=2_000)
COMPLETED = r"completed checkpoint (\d+) of job"


def expected(columns: list[str]) -> list[tuple]:
    """Update-mode rows are a pure function of the epoch boundaries, which are a pure
    function of the input: every correct run of SHAPE commits exactly these."""
    rows = as_canonical(aggregate_updates(SHAPE["total"], keys=SHAPE["keys"], per_epoch=SHAPE["per_epoch"]),
                        columns)
    assert len(rows) > 100
    return rows


def _kill_twice(job: Job, rng: random.Random) -> list[str]:
    notes = []
    for round_ in range(2):
        proc = job.start()
        if round_ == 0:
            # Right after a checkpoint completed: its Delta commit is in flight or done.
            m = proc.wait_for(COMPLETED, timeout=180)
            time.sleep(rng.uniform(0.0, 0.3))
            proc.kill9()
            notes.append(f"killed just after checkpoint {m.group(1)} completed")
        else:
            proc.wait_for(r"job status \S+ -> RUNNING", timeout=180)
            delay = rng.uniform(0.5, 3.0)  # short: both kills must land before the job ends
            time.sleep(delay)
            if proc.popen.poll() is not None:
                notes.append("finished before the kill")
                break
            proc.kill9()
            notes.append(f"killed {delay:.1f}s after RUNNING")
        assert "Traceback" not in proc.text or "FAILING" in proc.text, proc.text[-3000:]
    return notes


def _checkpoint_commits(table_history: list[dict]) -> list[int]:
    return [h["sparkpoint.checkpoint"] for h in table_history if "sparkpoint.checkpoint" in h]


def test_delta_sink_sigkill_twice_table_equals_the_updates_of_the_input(tmp_path: Path):
    from deltalake import DeltaTable

    seed = int(os.environ.get("SPARKPOINT_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    job = Job(tmp_path / "chaos", template=delta_pipeline(), **SHAPE)
    notes = _kill_twice(job, rng)
    assert sum(n.startswith("killed") for n in notes) == 2, f"seed {seed}: {notes}"
    final = job.run()
    assert final.popen.returncode == 0 and "FINISHED" in final.text, final.text[-3000:]

    table_rows = read_delta(str(job.out))
    got = canonical(table_rows, drop=())
    expected_rows = expected(table_rows.column_names)
    assert len(got) == len(expected_rows), f"seed {seed}: {notes}: {len(got)} rows vs {len(expected_rows)}"
    assert got == expected_rows, f"seed {seed}: {notes}"

    table = DeltaTable(str(job.out))
    commits = _checkpoint_commits(table.history())
    assert len(commits) == len(set(commits)), f"seed {seed}: a checkpoint was committed twice: {commits}"
    assert table.transaction_version(SHAPE["name"]) == max(commits)
    on_disk = sorted(str(p.relative_to(job.out)) for p in job.out.glob("epoch-*/*.parquet"))
    active = sorted(table.get_add_actions(flatten=True).column("path").to_pylist())
    assert on_disk == active, f"seed {seed}: data files no commit names were left behind"


def test_delta_sink_merging_by_key_sigkill_twice_table_holds_each_keys_final_totals(tmp_path: Path):
    """The same job merging its updates by key: after two kills the table holds one row
    per key, the key's totals over the whole input (the last of its updates)."""
    from deltalake import DeltaTable

    seed = int(os.environ.get("SPARKPOINT_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    job = Job(tmp_path / "merge", template=delta_pipeline(merge_keys=["key"]), **SHAPE)
    notes = _kill_twice(job, rng)
    assert sum(n.startswith("killed") for n in notes) == 2, f"seed {seed}: {notes}"
    final = job.run()
    assert final.popen.returncode == 0 and "FINISHED" in final.text, final.text[-3000:]

    table_rows = read_delta(str(job.out))
    latest = {}
    for row in aggregate_updates(SHAPE["total"], keys=SHAPE["keys"], per_epoch=SHAPE["per_epoch"], with_epoch=False):
        latest[row["key"]] = row  # in epoch order: the last is the key's final totals
    expected_rows = as_canonical(list(latest.values()), table_rows.column_names)
    got = canonical(table_rows, drop=())
    assert len(got) == len(expected_rows) == SHAPE["keys"], f"seed {seed}: {notes}: {len(got)} rows"
    assert got == expected_rows, f"seed {seed}: {notes}"
    table = DeltaTable(str(job.out))
    commits = _checkpoint_commits(table.history())
    assert len(commits) == len(set(commits)), f"seed {seed}: a checkpoint was merged twice: {commits}"
    assert table.transaction_version(SHAPE["name"]) == max(commits)
    assert not list(job.out.glob("epoch-*/*.parquet")), f"seed {seed}: staged files were left behind"


@pytest.mark.s3
def test_delta_sink_on_s3_sigkill_and_restart_is_exactly_once(tmp_path: Path, s3_server, s3_bucket: str):
    from sparkpoint.connectors.delta_sink import translate_storage_options

    options = s3_server.storage_options()
    url = f"s3://{s3_bucket}/table"
    job = Job(tmp_path / "s3", template=delta_pipeline(url, options), **SHAPE)
    first = job.start()
    deadline = time.monotonic() + 300
    while first.count(COMPLETED) < 2:
        assert first.popen.poll() is None, first.text[-3000:]
        assert time.monotonic() < deadline, first.text[-3000:]
        time.sleep(0.2)
    first.kill9()
    second = job.run()
    assert second.popen.returncode == 0 and "FINISHED" in second.text, second.text[-3000:]
    assert "restores checkpoint" in second.text
    table_rows = read_delta(url, translate_storage_options("s3", options))
    assert canonical(table_rows, drop=()) == expected(table_rows.column_names)
