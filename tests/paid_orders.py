"""The join-then-aggregate job the graph tests run in every setting (in process, as a
SIGKILLed `sparkpoint run` process, on the standalone cluster): orders left-joined with
their payments within 15 minutes of event time (IntervalJoin, how="left"), then revenue
per customer (KeyedAggregate) after the join. Both the joined rows and the revenue go to
sinks.

`write_input` writes the input files and returns them as pandas frames; `reference`
computes the answer from those frames alone with pandas. The job is one text
(`PIPELINE`): a file for `sparkpoint run`, and `build()` runs the same text for the
in-process tests, so every setting runs the same pipeline.

Input: each file holds 5 minutes of event time of each stream (orders 10 s apart); an
order is paid 30 s, 7 min, 14 min or 16 min after it (the last one too late to match),
or never, so pairs meet within an epoch and across epochs, and a fifth of the orders
come out unmatched only when the watermark passes their 15 minutes. Payments sit in
the file of their own event time, so with one file per epoch no row is ever late.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

FILE_MS = 5 * 60_000
ORDER_EVERY_MS = 10_000
WITHIN_MS = 15 * 60_000
DELAYS_MS = {1: 30_000, 2: 7 * 60_000, 3: 14 * 60_000, 4: 16 * 60_000}  # by order_id % 5; 0: never paid

PIPELINE = '''
import time

from sparkpoint import FileSource, IntervalJoin, KeyedAggregate, ParquetSink, Pipeline

p = Pipeline("{job}")


def files(directory, schema):
    return FileSource(r"{root}/" + directory, schema=schema, bounded=True, max_files_per_epoch=1, name=directory)


orders = p.read(files("orders", "order_id BIGINT, customer STRING, amount BIGINT, ts BIGINT")).watermark("ts", "2 s")
payments = p.read(files("payments", "order_id BIGINT, method STRING, paid_at BIGINT"))
if {pace_s}:  # the driver builds each epoch's plan through this step: an epoch takes at least this long
    payments = payments.transform(lambda df: (time.sleep({pace_s}), df)[1])
payments = payments.watermark("paid_at", "2 s")
paid = orders.join(payments, IntervalJoin("paid", "order_id", "order_id", "ts", "paid_at", 0, "15 min", how="left"))
paid.sink(ParquetSink(r"{out}/paid", name="paid"))
(paid.transform(lambda df: df.selectExpr("customer", "CASE WHEN paid_at IS NOT NULL THEN amount END AS paid_amount"))
 .stateful(KeyedAggregate("revenue", ["customer"], "paid_amount", ("count", "sum"), value_type="bigint"))
 .sink(ParquetSink(r"{out}/revenue", name="revenue")))
pipeline = p
'''


def pipeline_text(job: str, root: Path, out: Path, pace_s: float = 0.0) -> str:
    return PIPELINE.format(job=job, root=root, out=out, pace_s=pace_s)


def build(job: str, root: Path, out: Path, pace_s: float = 0.0):
    """The Pipeline object of `PIPELINE`."""
    scope: dict = {}
    exec(compile(pipeline_text(job, root, out, pace_s), f"<{job} pipeline>", "exec"), scope)
    return scope["pipeline"]


def write_input(root: Path, files: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    orders: list[list[dict]] = [[] for _ in range(files)]
    payments: list[list[dict]] = [[] for _ in range(files)]
    per_file = FILE_MS // ORDER_EVERY_MS
    for i in range(files * per_file):
        ts = i * ORDER_EVERY_MS
        orders[i // per_file].append({"order_id": i, "customer": f"c{i % 7}", "amount": (i * 37) % 101, "ts": ts})
        if i % 5:
            paid_at = ts + DELAYS_MS[i % 5]
            payments[min(files - 1, paid_at // FILE_MS)].append(
                {"order_id": i, "method": "card" if i % 3 else "cash", "paid_at": paid_at})
    for name, parts in (("orders", orders), ("payments", payments)):
        (root / name).mkdir(parents=True, exist_ok=True)
        for f, rows in enumerate(parts):
            (root / name / f"{f:03d}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return (pd.DataFrame([r for part in orders for r in part]),
            pd.DataFrame([r for part in payments for r in part]))


def reference(orders: pd.DataFrame, payments: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(every order once: with its payment if paid within 15 minutes, else with nulls;
    count and paid revenue per customer), from the input alone."""
    both = orders.merge(payments, on="order_id", how="left")
    in_time = (both.paid_at - both.ts).between(0, WITHIN_MS)
    both.loc[~in_time, ["method", "paid_at"]] = None
    paid = both[["order_id", "customer", "amount", "ts", "method", "paid_at"]].sort_values("order_id")
    revenue = (paid.assign(paid_amount=paid.amount.where(paid.paid_at.notna()))
               .groupby("customer").agg(count=("order_id", "size"), sum=("paid_amount", "sum"))
               .reset_index().sort_values("customer").reset_index(drop=True))
    return paid.reset_index(drop=True), revenue


def assert_exactly_once(out: Path, orders: pd.DataFrame, payments: pd.DataFrame) -> None:
    """The committed output under `out` equals the reference: every order exactly once in
    `paid/`, and each customer's last revenue row equal to its totals, no epoch's row twice."""
    from tests.e2e.harness import read_output

    want_paid, want_revenue = reference(orders, payments)
    got = read_output(out / "paid").to_pandas()
    assert not got.order_id.duplicated().any(), \
        f"orders committed twice: {sorted(got.order_id[got.order_id.duplicated()])[:10]}"
    assert sorted(got.order_id) == sorted(want_paid.order_id), \
        f"orders lost: {sorted(set(want_paid.order_id) - set(got.order_id))[:10]}"
    got = got[list(want_paid.columns)].sort_values("order_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want_paid, check_dtype=False)
    assert 0 < got.paid_at.isna().sum() < len(got), "some orders matched, some came out unmatched"

    revenue = read_output(out / "revenue").to_pandas()
    assert not revenue.duplicated(["epoch", "customer"]).any(), "an epoch's revenue row committed twice"
    last = (revenue.sort_values("epoch").groupby("customer").tail(1)[["customer", "count", "sum"]]
            .sort_values("customer").reset_index(drop=True))
    pd.testing.assert_frame_equal(last, want_revenue, check_dtype=False)
