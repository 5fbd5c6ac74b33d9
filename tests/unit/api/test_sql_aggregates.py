"""KeyedAggregate with several Spark SQL aggregates, against a brute-force reference
that keeps every row of a key (in arrival order) and computes each aggregate from
scratch, over random epochs in the user test harness, with a snapshot and restore
midway. (The same aggregates against Spark's own batch groupBy: tests/integration/
test_sql_aggregates_spark.py.)"""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest

from sparkpoint import KeyedAggregate
from sparkpoint.api.aggfuncs import parse_agg
from sparkpoint.errors import ConfigError
from sparkpoint.testing import ProcessorTester

AGGS = [
    "count(*) AS n", "count(v) AS nv", "count(*) FILTER (WHERE cheap) AS n_cheap", "sum(v) AS total",
    "sum(v) FILTER (WHERE cheap) AS total_cheap", "avg(v) AS mean", "min(v) AS lo", "max(s) AS hi_s",
    "count(DISTINCT s) AS ds", "count(DISTINCT s) FILTER (WHERE cheap) AS ds_cheap", "approx_count_distinct(s) AS ads",
    "first(v) AS first_v", "last(v) AS last_v", "first(v, true) AS first_nn", "last(s) FILTER (WHERE cheap) AS last_cheap",
    "collect_list(v) AS vs", "collect_set(s) AS ss", "percentile_approx(v, 0.5) AS med",
    "percentile_approx(v, array(0.1, 0.9)) AS tails",
]


def random_epochs(seed: int, epochs: int = 6, rows: int = 30) -> list[pd.DataFrame]:
    rnd = random.Random(seed)
    out = []
    for _ in range(epochs):
        out.append(pd.DataFrame({
            "k": [rnd.choice("abcd") for _ in range(rows)],
            "v": pd.array([None if rnd.random() < 0.15 else rnd.randrange(-20, 50) for _ in range(rows)], "Int64"),
            "s": [None if rnd.random() < 0.15 else rnd.choice(["x", "y", "z", "w"]) for _ in range(rows)],
            "cheap": [rnd.random() < 0.5 for _ in range(rows)],
        }))
    return out


def expected(rows: list[tuple]) -> dict:
    """Every aggregate of AGGS over one key's rows (k, v, s, cheap), in arrival order."""
    vs = [v for _, v, _, _ in rows if v is not None]
    cheap = [r for r in rows if r[3]]
    ss = [s for _, _, s, _ in rows if s is not None]
    srt = sorted(vs)

    def pct(p: float):
        return srt[min(max(math.ceil(p * len(srt)) - 1, 0), len(srt) - 1)] if srt else None
    cheap_vs = [v for _, v, _, _ in cheap if v is not None]
    return {
        "n": len(rows), "nv": len(vs), "n_cheap": len(cheap), "total": sum(vs) if vs else None,
        "total_cheap": sum(cheap_vs) if cheap_vs else None, "mean": sum(vs) / len(vs) if vs else None,
        "lo": min(vs) if vs else None, "hi_s": max(ss) if ss else None, "ds": len(set(ss)),
        "ds_cheap": len({s for _, _, s, _ in cheap if s is not None}), "ads": len(set(ss)),
        "first_v": rows[0][1], "last_v": rows[-1][1], "first_nn": vs[0] if vs else None,
        "last_cheap": cheap[-1][2] if cheap else None, "vs": vs, "ss": sorted(set(ss)), "med": pct(0.5),
        "tails": [pct(0.1), pct(0.9)] if srt else None,
    }


def plain(row: dict) -> dict:
    out = {k: (None if v is None or (isinstance(v, float) and v != v) else v) for k, v in row.items()}
    out["ss"] = sorted(out["ss"])  # a set: Spark gives no order either
    out["vs"], out["tails"] = list(out["vs"]), None if out["tails"] is None else list(out["tails"])
    return out


def step() -> KeyedAggregate:
    return KeyedAggregate("stats", ["k"], aggs=AGGS)


@pytest.mark.parametrize("restore_after", [None, 2], ids=["one-run", "restored-midway"])
def test_every_aggregate_of_each_touched_key_equals_a_recomputation_over_all_its_rows(restore_after) -> None:
    seen: dict[str, list[tuple]] = {}
    tester = ProcessorTester(step())
    for e, rows in enumerate(random_epochs(seed=3)):
        for r in rows.itertuples(index=False):
            seen.setdefault(r.k, []).append((r.k, None if pd.isna(r.v) else int(r.v), r.s, bool(r.cheap)))
        out = tester.process(rows)
        assert sorted(out["k"]) == sorted(set(rows["k"]))  # update mode: the keys of the epoch
        for row in out.to_dict("records"):
            assert plain(row) == {"k": row["k"], **expected(seen[row["k"]])}, row["k"]
        if e == restore_after:
            tester = ProcessorTester.from_snapshot(step(), tester.snapshot().to_json())


def test_output_types_follow_spark() -> None:
    tester = ProcessorTester(step())
    out = tester.process(random_epochs(seed=1, epochs=1)[0])
    types = {f.name: str(f.type) for f in tester.step.output_schema}
    assert types["n"] == types["ds"] == types["ads"] == "int64"
    assert types["total"] == "int64" and types["mean"] == "double" and types["hi_s"] == "string"
    assert types["vs"] == "list<item: int64>" and types["tails"] == "list<item: int64>"
    assert len(out) == 4


def test_state_built_with_other_aggregates_is_refused_with_one_line() -> None:
    tester = ProcessorTester(KeyedAggregate("stats", ["k"], aggs=["count(*) AS n"]))
    tester.process(random_epochs(seed=1, epochs=1)[0])
    snap = tester.snapshot().to_json()
    more = KeyedAggregate("stats", ["k"], aggs=["count(*) AS n", "sum(v) AS total"])
    restored = ProcessorTester.from_snapshot(more, snap)
    with pytest.raises(ConfigError, match="keep other partials than those its state was built with"):
        restored.process(random_epochs(seed=2, epochs=1)[0])


@pytest.mark.parametrize("text, error", [
    ("sum(price", "unbalanced"),
    ("median(price)", "not one of the supported aggregates"),
    ("sum(DISTINCT price)", "not supported"),
    ("count(*) FILTER (WHERE) AS x", "empty FILTER"),
    ("percentile_approx(price, 2)", "between 0 and 1"),
    ("sum(price) AS a b", "after the call"),
])
def test_a_malformed_aggregate_gets_one_line_naming_it(text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_agg(text, "KeyedAggregate 'x'")


def test_the_parser_keeps_arguments_and_conditions_as_spark_sql() -> None:
    call = parse_agg("count(DISTINCT lower(bidder)) FILTER (WHERE price >= 10000 and price < 1000000) AS rank2",
                     "x")
    assert (call.func, call.args, call.condition, call.alias) == (
        "count_distinct", ("lower(bidder)",), "price >= 10000 and price < 1000000", "rank2")
    assert parse_agg("count(1)", "x").func == "count_rows"
    assert parse_agg("max(DATE_FORMAT(dateTime, 'HH:mm')) AS `minute`", "x").args == ("DATE_FORMAT(dateTime, 'HH:mm')",)


def test_a_condition_only_spark_can_evaluate_gets_one_line_in_the_harness() -> None:
    tester = ProcessorTester(KeyedAggregate("x", ["k"], aggs=["count(*) FILTER (WHERE v < 10) AS n"]))
    with pytest.raises(ConfigError, match="compute the condition as a BOOLEAN column"):
        tester.process(random_epochs(seed=1, epochs=1)[0])
