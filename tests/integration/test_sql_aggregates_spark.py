"""Several Spark SQL aggregates in a KeyedAggregate (and in a window step): each epoch
pre-aggregated by Spark (`pre_aggregate`), merged across epochs in state, equals Spark's
own batch `groupBy(...).agg(...)` of the same aggregate texts over all the events."""

from __future__ import annotations

import random
import re

import pandas as pd
import pytest
from pyspark.sql import functions as F

from sparkpoint import KeyedAggregate
from sparkpoint.testing import ProcessorTester

# Arguments and conditions are expressions Spark evaluates (not plain columns).
AGGS = [
    "count(*) AS n", "count(v) AS nv", "count(*) FILTER (WHERE v < 10) AS n_cheap",
    "sum(v * 2) AS total2", "sum(v) FILTER (WHERE v >= 10 AND v < 30) AS total_mid", "avg(v) AS mean",
    "min(v) AS lo", "max(upper(s)) AS hi_s", "count(DISTINCT s) AS ds",
    "count(DISTINCT s) FILTER (WHERE v < 10) AS ds_cheap", "approx_count_distinct(s) AS ads",
    "collect_set(s) AS ss", "percentile_approx(v, 0.5) AS med", "percentile_approx(v, array(0.25, 0.75), 1000) AS q",
    "first(s) FILTER (WHERE v > 40) AS first_big", "collect_list(v) FILTER (WHERE v > 45) AS big",
]
SCHEMA = "k string, v bigint, s string, seq bigint"


def events(seed: int = 5, n: int = 400) -> pd.DataFrame:
    rnd = random.Random(seed)
    return pd.DataFrame({"k": [rnd.choice("abcde") for _ in range(n)],
                         "v": pd.array([None if rnd.random() < 0.1 else rnd.randrange(-20, 50) for _ in range(n)],
                                       "Int64"),
                         "s": [None if rnd.random() < 0.1 else rnd.choice(["x", "y", "z", "w", "v"]) for _ in range(n)],
                         "seq": range(n)})


def canonical(df: pd.DataFrame) -> list[dict]:
    def plain(v):
        if hasattr(v, "tolist"):
            v = v.tolist()
        if isinstance(v, list):
            return [plain(x) for x in v]
        return None if v is None or (isinstance(v, float) and v != v) else v
    rows = [{k: plain(v) for k, v in r.items()} for r in df.to_dict("records")]
    for r in rows:
        r["ss"] = sorted(r["ss"])  # sets: no order in Spark either
        r["big"] = sorted(r["big"])  # collect_list's order across a shuffle is Spark's choice
    return sorted(rows, key=lambda r: r["k"])


def test_keyed_aggregates_merged_across_spark_pre_aggregated_epochs_equal_spark_batch_groupby(spark) -> None:
    df = events()
    # first(...) over a shuffled batch is Spark's choice of row: the filter lets one row
    # of each key through (the last one with a string), so both sides must find it.
    picked = ", ".join(str(s) for s in df[df["s"].notna()].groupby("k")["seq"].max())
    aggs = [a.replace("FILTER (WHERE v > 40)", f"FILTER (WHERE seq IN ({picked}))") for a in AGGS]
    step = KeyedAggregate("stats", ["k"], aggs=aggs)
    tester = ProcessorTester(step)
    latest: dict[str, dict] = {}
    # Three epochs, each reduced by Spark to one row per key before it reaches state.
    for part in range(3):
        rows = df[df["seq"] % 3 == part]
        sdf = spark.createDataFrame(rows, SCHEMA)
        step.resolve_input_schema(sdf.limit(0).toArrow().schema)
        partials = step.pre_aggregate(sdf).toArrow()
        assert partials.num_rows == rows["k"].nunique()
        for r in tester.process(partials).to_dict("records"):
            latest[r["k"]] = r
    batch = spark.createDataFrame(df, SCHEMA).groupBy("k").agg(*[F.expr(a) for a in aggs]).toPandas()
    got, want = canonical(pd.DataFrame(list(latest.values()))), canonical(batch)
    assert len(got) == 5 and all(g["first_big"] is not None for g in got)
    assert got == want
    assert [f.name for f in step.output_schema] == ["k", *[a.rsplit(" AS ", 1)[1] for a in AGGS]]


WINDOW_AGGS = [a for a in AGGS if not a.startswith("first(")]  # first(): Spark's choice of row


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
def test_window_aggregates_merged_across_spark_pre_aggregated_epochs_equal_spark_batch_windows(spark, kind) -> None:
    from sparkpoint import SessionWindow, SlidingWindow, TumblingWindow

    make, window = {
        "tumbling": (lambda: TumblingWindow("tumble", ["k"], "ts", size="10 s", aggs=WINDOW_AGGS),
                     lambda t: F.window(t, "10 seconds")),
        "sliding": (lambda: SlidingWindow("hop", ["k"], "ts", size="10 s", slide="4 s", aggs=WINDOW_AGGS),
                    lambda t: F.window(t, "10 seconds", "4 seconds")),
        "session": (lambda: SessionWindow("sessions", ["k"], "ts", gap="3 s", aggs=WINDOW_AGGS),
                    lambda t: F.session_window(t, "3 seconds")),
    }[kind]
    rnd = random.Random(9)
    df = events(seed=9, n=300).assign(ts=[rnd.randrange(0, 90_000) // 100 * 100 for _ in range(300)])
    step = make()
    tester = ProcessorTester(step)
    for part in range(3):  # epochs out of event-time order: windows and sessions merge across them
        sdf = spark.createDataFrame(df[df["seq"] % 3 == part], SCHEMA + ", ts bigint")
        step.resolve_input_schema(sdf.limit(0).toArrow().schema)
        tester.process(step.pre_aggregate(sdf).toArrow())
    got = tester.finish().drop(columns=["late"])
    names = [a.rsplit(" AS ", 1)[1] for a in WINDOW_AGGS]
    reference = WINDOW_AGGS
    if kind == "session":
        # Spark 4's batch session_window miscounts count(DISTINCT ...) (13 for a session
        # whose collect_set holds 4 values: the distinct rewrite expands rows before
        # sessions merge); its collect_set is right, so the reference counts that.
        reference = [re.sub(r"count\(DISTINCT s\)( FILTER \(WHERE [^)]*\))?", r"size(collect_set(s)\1)", a)
                     for a in WINDOW_AGGS]
    batch = spark.createDataFrame(df, SCHEMA + ", ts bigint").groupBy("k", window(F.timestamp_millis("ts")).alias("w")) \
        .agg(*[F.expr(a) for a in reference]) \
        .select("k", F.unix_millis("w.start").alias("window_start"), F.unix_millis("w.end").alias("window_end"),
                *names).toPandas()
    key = ["k", "window_start", "window_end"]
    got_rows = sorted(canonical(got), key=lambda r: [r[c] for c in key])
    want_rows = sorted(canonical(batch), key=lambda r: [r[c] for c in key])
    assert len(got_rows) > 20
    assert got_rows == want_rows
