"""SIGKILL a real pipeline process at random moments (one of
them inside a checkpoint's asynchronous part), restart it each time, and the
committed output equals what the input alone says it must be (tests/e2e/chaos_oracles.py:
the generator's events recomputed, no failure-free reference job): nothing lost, nothing
duplicated. A keyed aggregate's update-mode output across a crash (epoch boundaries
included) is tests/integration/test_aggregate_updates_inprocess.py."""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.e2e.chaos_oracles import as_canonical, window_rows
from tests.e2e.harness import Job, canonical

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


def test_sigkill_twice_output_equals_the_windows_of_the_input(tmp_path):
    seed = int(os.environ.get("SPARKPOINT_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    job = Job(tmp_path / "chaos", sets=[SLOW_ASYNC])
    # No event is late (disorder 1 s, watermark delay 2 s): the windows do not depend on
    # where epochs begin, so they follow from the input alone.
    expected = as_canonical(window_rows(job.total, keys=job.keys, disorder_ms=1_000),
                            ["key", "window_start", "window_end", "count", "sum"])
    assert sum(r[3] for r in expected) == job.total  # every event counted in exactly one window

    # One kill inside a checkpoint's asynchronous part, one at a random moment.
    notes = _chaos(job, rng, kills=2)
    final = job.run()
    assert final.popen.returncode == 0, final.text[-3000:]
    assert "restores checkpoint" in final.text or "FINISHED" in final.text
    output = job.output()
    got = canonical(output)
    assert [c for c in output.column_names if c != "epoch"] == ["key", "window_start", "window_end", "count", "sum"]
    assert len(got) == len(expected), f"seed {seed}: {notes}: {len(got)} rows vs {len(expected)}"
    assert got == expected, f"seed {seed}: {notes}"
