"""Joins in a running pipeline (`left.join(right, op)`), on the shared SparkSession: orders
joined with their payments from files, each run's committed output compared with a
pandas answer from the input files alone.

Needs the pipeline graph API (`Pipeline.read`, `Stream.join`); on a tree without it the
tests skip."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sparkpoint import FileSource, IntervalJoin, ParquetSink, Pipeline, StreamJoin, WindowJoin
from tests.e2e.harness import read_output
from tests.inprocess import job_settings

pytestmark = pytest.mark.spark

ORDERS = "order_id BIGINT, customer STRING, amount BIGINT, ts BIGINT"
PAYMENTS = "order_id BIGINT, method STRING, ts BIGINT"
FILES = 4


def write_input(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Orders a second apart; two in three get paid 0, 4, 8 or 12 s later (by order id),
    one file per epoch, so pairs meet within an epoch and across epochs."""
    orders, payments = [], []
    for f in range(FILES):
        o = [{"order_id": i, "customer": f"c{i % 5}", "amount": i, "ts": i * 1000} for i in range(f * 30, f * 30 + 30)]
        p = [{"order_id": r["order_id"], "method": "card", "ts": r["ts"] + (r["order_id"] % 4) * 4000}
             for r in o if r["order_id"] % 3]
        for name, rows in (("orders", o), ("payments", p)):
            (root / name).mkdir(parents=True, exist_ok=True)
            (root / name / f"{f:03d}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
        orders += o
        payments += p
    return pd.DataFrame(orders), pd.DataFrame(payments)


def run_join(spark, source: Path, tmp_path: Path, make_op, watermark: bool) -> pd.DataFrame:
    from sparkpoint.runtime.jobmaster import JobMaster
    from sparkpoint.runtime.status import JobStatus

    if not hasattr(Pipeline, "read"):
        pytest.skip("needs the pipeline graph API (Pipeline.read, Stream.join)")
    p = Pipeline("orders-payments")

    def files(directory: str, schema: str):
        stream = p.read(FileSource(str(source / directory), schema=schema, bounded=True,
                                   max_files_per_epoch=1, name=directory))
        return stream.watermark("ts", "2 s") if watermark else stream

    files("orders", ORDERS).join(files("payments", PAYMENTS), make_op()) \
        .sink(ParquetSink(str(tmp_path / "out"), name="joined"))
    result = JobMaster(p, job_settings(tmp_path, "orders-payments"), spark=spark).run()
    assert result.status is JobStatus.FINISHED
    return read_output(tmp_path / "out").to_pandas()


def test_a_left_interval_join_in_a_pipeline_equals_the_pandas_answer(spark, tmp_path: Path) -> None:
    orders, payments = write_input(tmp_path / "in")
    got = run_join(spark, tmp_path / "in", tmp_path,
                   lambda: IntervalJoin("paid", "order_id", "order_id", "ts", "ts", 0, "10 s", how="left"),
                   watermark=True)
    both = orders.merge(payments, on="order_id", how="left", suffixes=("", "_right"))
    within = (both.ts_right - both.ts).between(0, 10_000)
    assert 0 < within.sum() < len(both)  # some paid in time, some late, some never
    assert sorted(got.order_id) == sorted(orders.order_id), "every order once, paid or not"
    assert sorted(got[got.ts_right.notna()].order_id) == sorted(both[within].order_id)
    assert got[got.ts_right.isna()].method.isna().all()


def test_a_stream_join_and_a_window_join_in_a_pipeline_equal_the_pandas_answer(spark, tmp_path: Path) -> None:
    orders, payments = write_input(tmp_path / "in")
    got = run_join(spark, tmp_path / "in", tmp_path / "s", lambda: StreamJoin("paid", "order_id", "order_id"),
                   watermark=False)
    assert sorted(got.order_id) == sorted(orders.merge(payments, on="order_id").order_id)

    got = run_join(spark, tmp_path / "in", tmp_path / "w",
                   lambda: WindowJoin("paid", "order_id", "order_id", "ts", "ts", "10 s"), watermark=True)
    both = orders.merge(payments, on="order_id", suffixes=("", "_right"))
    same_window = both.ts // 10_000 == both.ts_right // 10_000
    assert sorted(got.order_id) == sorted(both[same_window].order_id)
    assert (got.window_end - got.window_start == 10_000).all()


def test_a_left_interval_join_killed_mid_run_and_restored_at_another_parallelism_commits_exactly_once(
        spark, tmp_path: Path) -> None:
    from sparkpoint.runtime.status import JobStatus
    from tests.inprocess import CrashPoint, restart, start

    if not hasattr(Pipeline, "read"):
        pytest.skip("needs the pipeline graph API (Pipeline.read, Stream.join)")
    orders, payments = write_input(tmp_path / "in")

    def pipeline() -> Pipeline:
        p = Pipeline("paid-rescaled")
        streams = [p.read(FileSource(str(tmp_path / "in" / d), schema=s, bounded=True, max_files_per_epoch=1,
                                     name=d)).watermark("ts", "2 s") for d, s in (("orders", ORDERS),
                                                                                 ("payments", PAYMENTS))]
        streams[0].join(streams[1], IntervalJoin("paid", "order_id", "order_id", "ts", "ts", 0, "10 s",
                                                 how="left")) \
            .sink(ParquetSink(str(tmp_path / "out"), name="joined"))
        return p

    fast = {"execution.checkpointing.interval": "200 ms"}
    first = start(pipeline(), job_settings(tmp_path, "paid-rescaled", **fast, **{"parallelism.default": 2}), spark,
                  crash_at=CrashPoint.after_epoch(2)).wait_crashed()
    second = restart(first, pipeline(), spark,
                     settings=job_settings(tmp_path, "paid-rescaled", **fast, **{"parallelism.default": 3}))
    result = second.wait()
    assert result.status is JobStatus.FINISHED, second.tail()
    assert second.job.restored_from is not None, "the second run restored a checkpoint of the first"
    got = read_output(tmp_path / "out").to_pandas()
    both = orders.merge(payments, on="order_id", how="left", suffixes=("", "_right"))
    within = (both.ts_right - both.ts).between(0, 10_000)
    assert sorted(got.order_id) == sorted(orders.order_id), "every order exactly once, paid or not"
    assert sorted(got[got.ts_right.notna()].order_id) == sorted(both[within].order_id)
