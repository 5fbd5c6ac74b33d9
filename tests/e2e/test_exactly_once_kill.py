"""SIGKILL a real pipeline process at random moments (one of
them inside a checkpoint's asynchronous part), restart it each time, and the
committed output equals the failure-free run's: nothing lost, nothing duplicated."""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.e2e.harness import AGGREGATE_PIPELINE, Job, canonical

pytestmark = pytest.mark.e2e

# Every state upload sleeps 1.5 s, so a kill right after one starts lands inside it.
SLOW_ASYNC = 'sparkpoint.faults=[{participant: "state:*", action: slow_ack, seconds: 1.5}]'


def _chaos(job: Job, rng: random.Random, kills: int) -> list[str]:
    notes = []
    for round_ in range(kills):
        proc = job.start()
        if round_ == 0:
            # Inside the asynchronous part of a checkpoint: after its upload began and
            # before the checkpoint could complete.
            m = proc.wait_for(r"checkpoint (\d+): asynchronous part of state:\S+ started", timeout=180)
            time.sleep(rng.uniform(0.1, 1.0))
            cid = m.group(1)
            completed = proc.count(rf"completed checkpoint {cid} of job")
            proc.kill9()
            assert completed == 0, "the kill was meant to land inside the asynchronous part"
            notes.append(f"killed during async part of checkpoint {cid}")
        else:
            proc.wait_for(r"job status \S+ -> RUNNING", timeout=180)
            delay = rng.uniform(1.0, 6.0)
            time.sleep(delay)
            if proc.popen.poll() is not None:
                notes.append("finished before the kill")
                break
            proc.kill9()
            notes.append(f"killed {delay:.1f}s after RUNNING")
        assert "Traceback" not in proc.text or "FAILING" in proc.text, proc.text[-3000:]
    return notes


def test_sigkill_three_times_output_equals_failure_free_run(tmp_path):
    seed = int(os.environ.get("SPARKPOINT_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    ref = Job(tmp_path / "reference")
    proc = ref.run()
    assert proc.popen.returncode == 0 and "FINISHED" in proc.text, proc.text[-3000:]
    expected = canonical(ref.output())
    assert sum(r[3] for r in expected) == ref.total  # every event counted in exactly one window

    job = Job(tmp_path / "chaos", sets=[SLOW_ASYNC])
    notes = _chaos(job, rng, kills=3)
    final = job.run()
    assert final.popen.returncode == 0, final.text[-3000:]
    assert "restores checkpoint" in final.text or "FINISHED" in final.text
    got = canonical(job.output())
    assert len(got) == len(expected), f"seed {seed}: {notes}: {len(got)} rows vs {len(expected)}"
    assert got == expected, f"seed {seed}: {notes}"


def test_keyed_aggregate_updates_are_exactly_once_after_kills(tmp_path):
    """Update-mode output depends on epoch boundaries; those are a pure function of the
    restored positions, so even the per-epoch updates must match the reference."""
    seed = int(os.environ.get("SPARKPOINT_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    ref = Job(tmp_path / "reference", template=AGGREGATE_PIPELINE, keys=500, total=200_000)
    assert ref.run().popen.returncode == 0
    expected = canonical(ref.output(), drop=())

    job = Job(tmp_path / "chaos", template=AGGREGATE_PIPELINE, keys=500, total=200_000)
    proc = job.start()
    proc.wait_for(r"completed checkpoint \d+ of job", timeout=180)
    time.sleep(rng.uniform(0.0, 1.5))
    proc.kill9()
    final = job.run()
    assert final.popen.returncode == 0, final.text[-3000:]
    assert canonical(job.output(), drop=()) == expected, f"seed {seed}"
