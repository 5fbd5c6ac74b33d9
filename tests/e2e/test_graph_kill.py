"""SIGKILL a join-then-aggregate graph (`sparkpoint run` of tests/paid_orders.py's
pipeline: orders left-joined with payments within 15 minutes, then revenue per
customer) mid-run, run it again, and both sinks' committed output equals the pandas
answer from the input alone: every order once, matched or emitted unmatched, and each
customer's revenue, nothing lost or duplicated.

One kill is enough for what the graph adds, and it lands where the most is in flight:
after a checkpoint completed, inside the asynchronous part of the next one, so epochs
past the completed checkpoint have staged output of both sinks, join state, event
times and an outer row's emission that no checkpoint covers yet (a kill at any other
moment of one epoch loop is covered by tests/e2e/test_exactly_once_kill.py).
"""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.e2e.harness import Job
from tests.paid_orders import assert_exactly_once, pipeline_text, write_input

pytestmark = pytest.mark.e2e

FILES = 12
# Every state upload sleeps 1 s, so a kill right after one starts lands inside it.
SLOW_ASYNC = 'sparkpoint.faults=[{participant: "state:*", action: slow_ack, seconds: 1.0}]'


def _job(root, name: str) -> Job:
    text = pipeline_text(name, root / "in", root / "out", pace_s=0.4)
    return Job(root, name=name, template=text.replace("{", "{{").replace("}", "}}"),
               sets=["execution.checkpointing.interval=300 ms", SLOW_ASYNC])


def test_a_join_graph_killed_mid_checkpoint_commits_the_pandas_answer_exactly_once(tmp_path):
    seed = int(os.environ.get("SPARKPOINT_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    orders, payments = write_input(tmp_path / "in", FILES)
    job = _job(tmp_path, "paid-kill")

    first = job.start()
    first.wait_for(r"completed checkpoint \d+ of job", timeout=180)
    at = first.wait_for(r"checkpoint (\d+): asynchronous part of state:\S+ started", timeout=180,
                        start_at=len(first.lines))  # of a checkpoint after the completed one
    time.sleep(rng.uniform(0.1, 0.6))
    in_flight = first.count(rf"completed checkpoint {at.group(1)} of job") == 0
    assert first.popen.poll() is None, f"seed {seed}: the job finished before the kill:\n{first.tail()}"
    first.kill9()
    assert in_flight, f"seed {seed}: the kill was meant to land inside an asynchronous part"

    final = job.run(timeout=240)
    assert final.popen.returncode == 0, final.text[-3000:]
    assert "restores checkpoint" in final.text or "resuming from checkpoint" in final.text, final.text[-3000:]
    assert_exactly_once(tmp_path / "out", orders, payments)
