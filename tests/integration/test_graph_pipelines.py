"""Pipelines as graphs, run on the shared SparkSession: two order streams unioned, joined
with a payment stream (a two-input step), then revenue per customer (a second stateful
step chained after the join), with the join's output also going to a second sink.

Every run's committed output is compared with an answer computed by pandas from the
input files alone: the matched orders exactly once each, and the last revenue row per
customer equal to that customer's totals, with no (epoch, customer) twice."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from sparkpoint import FileSource, KeyedAggregate, ParquetSink, Pipeline
from sparkpoint.errors import ConfigError
from sparkpoint.runtime.jobmaster import JobMaster
from sparkpoint.runtime.status import JobStatus
from tests.e2e.harness import read_output
from tests.graph_support import InnerJoin
from tests.inprocess import CrashPoint, job_settings, restart, start

pytestmark = pytest.mark.spark

ORDERS = "order_id BIGINT, customer STRING, amount BIGINT"
PAYMENTS = "order_id BIGINT, method STRING"
FILES = 6


def write_input(root: Path, files_per_source: int = 0) -> dict[str, pd.DataFrame]:
    """Orders split over two directories (even ids in orders_a/, odd in orders_b/), and
    payments for two thirds of them: some in the same file number as their order, some
    one file later (so a pair meets across epochs, in join state)."""
    n = files_per_source or FILES
    frames: dict[str, list[dict]] = {"orders_a": [], "orders_b": [], "payments": []}
    files: dict[str, list[list[dict]]] = {k: [[] for _ in range(n)] for k in frames}
    for i in range(n * 40):
        f = i // 40
        files["orders_a" if i % 2 == 0 else "orders_b"][f].append(
            {"order_id": i, "customer": f"c{i % 7}", "amount": (i * 37) % 101})
        if i % 3:
            files["payments"][min(n - 1, f + i % 3 - 1)].append({"order_id": i, "method": "card" if i % 4 else "cash"})
    for name, parts in files.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for f, rows in enumerate(parts):
            _write(root / name / f"{f:03d}.json", rows)
            frames[name] += rows
    return {k: pd.DataFrame(v) for k, v in frames.items()}


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def expected(frames: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    orders = pd.concat([frames["orders_a"], frames["orders_b"]])
    matched = orders.merge(frames["payments"], on="order_id")
    revenue = (matched.groupby("customer").agg(count=("amount", "size"), sum=("amount", "sum"))
               .reset_index().sort_values("customer").reset_index(drop=True))
    pairs = matched.assign(key=matched.order_id.astype(str), amount=matched.amount.astype(str))
    return pairs[["key", "customer", "amount", "method"]].sort_values("key").reset_index(drop=True), revenue


def graph(name: str, root: Path, out: Path, revenue_step: str = "revenue", pace_s: float = 0.0) -> Pipeline:
    p = Pipeline(name)

    def files(directory: str, schema: str) -> FileSource:
        return FileSource(str(root / directory), schema=schema, bounded=True, max_files_per_epoch=1,
                          name=directory)

    orders = p.read(files("orders_a", ORDERS)).union(p.read(files("orders_b", ORDERS)))
    payments = p.read(files("payments", PAYMENTS))
    if pace_s:  # the driver builds each epoch's plan through this step: epochs take at least pace_s
        payments = payments.transform(lambda df: (time.sleep(pace_s), df)[1])
    matched = orders.join(payments, InnerJoin("matched", "order_id", ["customer", "amount"], ["method"]))
    matched.sink(ParquetSink(str(out / "matched"), name="matched"))
    (matched.transform(lambda df: df.selectExpr("customer", "cast(amount as bigint) as amount"))
     .stateful(KeyedAggregate(revenue_step, ["customer"], "amount", ("count", "sum"), value_type="bigint"))
     .sink(ParquetSink(str(out / "revenue"), name="revenue")))
    return p


def assert_exactly_once(out: Path, frames: dict[str, pd.DataFrame]) -> None:
    want_pairs, want_revenue = expected(frames)
    pairs = read_output(out / "matched").to_pandas()
    got_pairs = pairs[["key", "customer", "amount", "method"]].sort_values("key").reset_index(drop=True)
    assert len(got_pairs) == len(want_pairs), "matched orders lost or duplicated"
    pd.testing.assert_frame_equal(got_pairs, want_pairs, check_dtype=False)
    revenue = read_output(out / "revenue").to_pandas()
    assert not revenue.duplicated(["epoch", "customer"]).any(), "an epoch's revenue row committed twice"
    last = (revenue.sort_values("epoch").groupby("customer").tail(1)[["customer", "count", "sum"]]
            .sort_values("customer").reset_index(drop=True))
    pd.testing.assert_frame_equal(last, want_revenue, check_dtype=False)


def test_two_sources_unioned_joined_with_a_third_then_a_second_step_equal_the_pandas_answer(spark, tmp_path):
    frames = write_input(tmp_path / "in")
    out = tmp_path / "out"
    job = JobMaster(graph("graph", tmp_path / "in", out), job_settings(tmp_path, "graph"), spark=spark)
    result = job.run()
    assert result.status is JobStatus.FINISHED
    assert_exactly_once(out, frames)
    assert result.records == sum(len(f) for f in frames.values()), "every source's records counted once"
    handles = job.coordinator.completed_store.latest().handles
    assert {"source:orders_a", "source:orders_b", "source:payments", "sink:matched", "sink:revenue",
            "state:matched/0", "state:matched/1", "state:revenue/0", "state:revenue/1"} <= set(handles)


def test_a_two_step_graph_killed_mid_run_and_restored_commits_every_output_exactly_once(spark, tmp_path):
    frames = write_input(tmp_path / "in")
    out, name = tmp_path / "out", "graph-crash"
    settings = job_settings(tmp_path, name, **{"execution.checkpointing.interval": "200 ms"})
    first = start(graph(name, tmp_path / "in", out), settings, spark,
                  crash_at=CrashPoint.after_epoch(3)).wait_crashed()
    assert not first.job.final_done
    second = restart(first, graph(name, tmp_path / "in", out), spark)
    result = second.wait()
    assert result.status is JobStatus.FINISHED, second.tail()
    assert second.job.restored_from is not None, "the second run restored a checkpoint of the first"
    assert_exactly_once(out, frames)


def test_a_renamed_step_stops_the_restore_with_one_line_naming_it_unless_its_state_is_dropped(spark, tmp_path):
    frames = write_input(tmp_path / "in")
    out, name = tmp_path / "out", "graph-rename"
    settings = job_settings(tmp_path, name, **{"execution.checkpointing.interval": "200 ms"})
    first = start(graph(name, tmp_path / "in", out), settings, spark,
                  crash_at=CrashPoint.after_metadata(1)).wait_crashed()
    assert list((tmp_path / "checkpoints" / name).glob("chk-*/_metadata")), "a checkpoint completed"

    renamed = graph(name, tmp_path / "in", out, revenue_step="revenue_v2")
    refused = restart(first, renamed, spark)
    with pytest.raises(ConfigError) as e:
        refused.wait()
    line = str(e.value)
    assert "\n" not in line
    assert "holds the state of step 'revenue', which the pipeline no longer has" in line
    assert "--allow-non-restored-state (execution.savepoint.ignore-unclaimed-state=true)" in line
    assert "does not cover every key group" not in line
    assert refused.job.coordinator.stats.snapshot()["restore_refusals"] == {"UNCLAIMED_STATE": 1}

    dropped = JobMaster(graph(name, tmp_path / "in", out, revenue_step="revenue_v2"),
                        job_settings(tmp_path, name, **{"execution.savepoint.ignore-unclaimed-state": True}),
                        spark=spark)
    result = dropped.run()
    assert result.status is JobStatus.FINISHED
    # The join's state was restored, so every pair is still committed exactly once; the new
    # revenue step started empty and so only counts what it saw after the restore.
    pairs = read_output(out / "matched").to_pandas()
    assert len(pairs) == len(expected(frames)[0]) and not pairs.duplicated("key").any()
    assert "revenue_v2" in {k.split(":")[1].split("/")[0] for k in
                            dropped.coordinator.completed_store.latest().handles if k.startswith("state:")}


def _linear(name: str, root: Path, out: Path, step: str) -> Pipeline:
    return (Pipeline(name).source(FileSource(str(root / "orders_a"), schema=ORDERS, bounded=True,
                                             max_files_per_epoch=1, name="orders"))
            .stateful(KeyedAggregate(step, ["customer"], "amount", ("count", "sum"), value_type="bigint"))
            .sink(ParquetSink(str(out))))


def test_a_renamed_step_of_a_linear_pipeline_is_named_not_reported_as_corrupt_state(spark, tmp_path):
    """Before steps were checked by name, this restore found no state under the new name and
    called the checkpoint corrupt ("does not cover every key group"), then refused every
    checkpoint in turn."""
    write_input(tmp_path / "in")
    out, name = tmp_path / "out", "linear-rename"
    first = start(_linear(name, tmp_path / "in", out, "totals"), job_settings(tmp_path, name), spark,
                  crash_at=CrashPoint.after_metadata(1)).wait_crashed()
    renamed = restart(first, _linear(name, tmp_path / "in", out, "totals_by_customer"), spark)
    with pytest.raises(ConfigError, match=r"^checkpoint 1 holds the state of step 'totals', which the pipeline no "
                                          r"longer has .*--allow-non-restored-state"):
        renamed.wait()


def test_a_savepoint_of_a_two_step_graph_restored_at_another_parallelism_gives_the_unstopped_output(
        spark, tmp_path):
    # 8 epochs of input; checkpoints every 200 ms, so the savepoint comes a few epochs in,
    # with most of the input left for the restored run.
    frames = write_input(tmp_path / "in", files_per_source=8)
    out, name = tmp_path / "out", "graph-savepoint"
    first = JobMaster(graph(name, tmp_path / "in", out, pace_s=0.3),
                      job_settings(tmp_path, name, **{"parallelism.default": 2,
                                                       "execution.checkpointing.interval": "200 ms"}), spark=spark)
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
    assert first.epoch < 8, "stopped before the input ended"
    moved = tmp_path / "moved-savepoint"  # savepoints are self-contained
    shutil.copytree(savepoint, moved)
    shutil.rmtree(savepoint)

    second = JobMaster(graph(name, tmp_path / "in", out),
                       job_settings(tmp_path, name, **{"parallelism.default": 3,
                                                        "execution.state-recovery.path": str(moved)}), spark=spark)
    assert second.run().status is JobStatus.FINISHED
    handles = second.coordinator.completed_store.latest().handles
    assert {f"state:{step}/{i}" for step in ("matched", "revenue") for i in range(3)} <= set(handles)
    assert_exactly_once(out, frames)


def test_a_window_over_two_streams_waits_for_the_slower_one_so_none_of_its_rows_is_late(spark, tmp_path):
    """Stream `behind` runs 30 s of event time behind `ahead`. The window's watermark is the
    minimum of the two (a maximum would make every row of `behind` late and drop it); the
    output equals pandas' count per key and 10 s window over both streams."""
    from sparkpoint import TumblingWindow

    rows: dict[str, list[dict]] = {"ahead": [], "behind": []}
    for name, lag_ms in (("ahead", 0), ("behind", 30_000)):
        (tmp_path / name).mkdir()
        for f in range(FILES):
            part = [{"key": k % 5, "ts": 100_000 + f * 10_000 + k * 97 - lag_ms} for k in range(50)]
            rows[name] += part
            _write(tmp_path / name / f"{f:03d}.json", part)
    p = Pipeline("two-watermarks")

    def read(name: str):
        return p.read(FileSource(str(tmp_path / name), schema="key BIGINT, ts BIGINT", bounded=True,
                                 max_files_per_epoch=1, name=name)).watermark("ts", "5 s")

    (read("ahead").union(read("behind"))
     .stateful(TumblingWindow("per_10s", ["key"], "ts", size_ms=10_000, aggs=("count",)))
     .sink(ParquetSink(str(tmp_path / "out"))))
    job = JobMaster(p, job_settings(tmp_path, "two-watermarks"), spark=spark)
    assert job.run().status is JobStatus.FINISHED

    events = pd.DataFrame(rows["ahead"] + rows["behind"])
    events["window_start"] = events.ts - events.ts % 10_000
    want = events.groupby(["key", "window_start"]).size().rename("count").reset_index()
    got = read_output(tmp_path / "out").to_pandas()[["key", "window_start", "count"]]
    assert job.late_dropped == 0
    pd.testing.assert_frame_equal(got.sort_values(["key", "window_start"]).reset_index(drop=True),
                                  want.sort_values(["key", "window_start"]).reset_index(drop=True),
                                  check_dtype=False)
    assert set(job.coordinator.completed_store.latest().handles["job"]["event_times"]) == {"ahead", "behind"}
