"""A join-then-aggregate graph (tests/paid_orders.py: orders left-joined with payments
within 15 minutes, then revenue per customer, two sinks) crashes in-process
(tests/inprocess.py) where the most is in flight, and the restart commits both sinks'
pandas answer from the input alone: every order once, matched or emitted unmatched, and
each customer's revenue, nothing lost or duplicated.

The crash lands after a checkpoint completed, inside the asynchronous part of a later
one: epochs past the completed checkpoint have staged output of both sinks, join state,
event times and an outer row's emission that no checkpoint covers yet. The same graph
under a real SIGKILL of a worker is tests/cluster/test_cluster_exactly_once.py; a
SIGKILL of a local driver with its Python workers is tests/e2e/test_chaos.py (a windowed
job: what a process boundary adds does not depend on the pipeline's shape)."""

from __future__ import annotations

import pytest

from sparkpoint.runtime.status import JobStatus
from tests.e2e.harness import read_output
from tests.inprocess import CrashPoint, job_settings, restart, start
from tests.paid_orders import assert_exactly_once, build, write_input

pytestmark = pytest.mark.spark

FILES = 12
# Every state subtask's asynchronous part takes 1 s, so the crash lands while one is in flight.
SLOW_ACKS = [{"participant": "state:*", "action": "slow_ack", "seconds": 1.0}]


def test_a_join_graph_crashed_mid_checkpoint_commits_the_pandas_answer_exactly_once(spark, tmp_path):
    orders, payments = write_input(tmp_path / "in", FILES)
    out, name = tmp_path / "out", "paid-crash"
    settings = job_settings(tmp_path, name, **{"execution.checkpointing.interval": "300 ms",
                                                "sparkpoint.faults": SLOW_ACKS})
    first = start(build(name, tmp_path / "in", out, pace_s=0.3), settings, spark,
                  crash_at=CrashPoint.during_async_part(after_completed=1)).wait_crashed()
    assert first.switch.completed >= 1, first.tail()
    assert not first.job.final_done, "no final checkpoint after a crash"
    staged = list((out / "paid" / "_staging").rglob("*.parquet")) + list(
        (out / "revenue" / "_staging").rglob("*.parquet"))
    assert staged, "the crash left staged output no checkpoint committed"
    committed = len(read_output(out / "paid"))
    assert committed < len(orders), "the crash came before the input ended"

    second = restart(first, build(name, tmp_path / "in", out), spark,
                     job_settings(tmp_path, name, **{"execution.checkpointing.interval": "300 ms"}))
    result = second.wait()
    assert result.status is JobStatus.FINISHED, second.tail()
    assert second.job.restored_from is not None, "the second run restored a checkpoint of the first"
    assert_exactly_once(out, orders, payments)
