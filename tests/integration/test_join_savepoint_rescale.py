"""A join-then-aggregate graph (orders left-joined with payments within 15 minutes, then
revenue per customer; tests/paid_orders.py) stopped with a savepoint and restored from it
at another parallelism commits exactly the output of a run that never stopped: the
pandas answer from the input alone, every order once (matched, or unmatched once the
watermark passed its 15 minutes, which needs the restored join state and event times)."""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus
from tests.inprocess import job_settings
from tests.paid_orders import assert_exactly_once, build, write_input

pytestmark = pytest.mark.spark

FILES = 10


@pytest.mark.parametrize("before, after", [(2, 3), (3, 2)])
def test_a_join_graph_restored_from_a_savepoint_at_another_parallelism_gives_the_unstopped_output(
        spark, tmp_path, before, after):
    orders, payments = write_input(tmp_path / "in", FILES)
    out, name = tmp_path / "out", f"paid-savepoint-{before}-{after}"
    first = JobMaster(build(name, tmp_path / "in", out, pace_s=0.3),
                      job_settings(tmp_path, name, **{"parallelism.default": before}), spark=spark)
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("result", first.run()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not (first.epoch >= 3 and first.coordinator.stats.snapshot().get("completed", 0) >= 1):
        assert thread.is_alive() and time.monotonic() < deadline, "the first run ended before its savepoint"
        time.sleep(0.05)
    savepoint = first.stop(savepoint=True).result(120)
    thread.join(120)
    assert outcome["result"].status is JobStatus.FINISHED
    assert first.epoch < FILES - 1, "stopped before the input ended"
    moved = tmp_path / "moved-savepoint"  # savepoints are self-contained
    shutil.copytree(savepoint, moved)
    shutil.rmtree(savepoint)

    second = JobMaster(build(name, tmp_path / "in", out),
                       job_settings(tmp_path, name, **{"parallelism.default": after,
                                                        "execution.state-recovery.path": str(moved)}), spark=spark)
    assert second.run().status is JobStatus.FINISHED
    assert second.restored_from is not None
    handles = second.coordinator.completed_store.latest().handles
    assert {f"state:{step}/{i}" for step in ("paid", "revenue") for i in range(after)} <= set(handles)
    assert not {f"state:{step}/{after}" for step in ("paid", "revenue")} & set(handles)
    assert_exactly_once(out, orders, payments)
