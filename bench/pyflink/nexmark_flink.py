"""Nexmark on Apache Flink via PyFlink (the peer of bench/nexmark.py): nexmark-flink's SQL for each
query (github.com/nexmark/nexmark, nexmark-flink/src/main/resources/queries/qN.sql), over the Parquet
files `sparkpoint nexmark generate` wrote, one job per query in one mini-cluster process.

    bench/.venv-pyflink/bin/python bench/pyflink/nexmark_flink.py --events N --queries q0,q1,...
        --jars DIR [--files-per-stream 20] [--files-per-epoch 2] [--work /tmp/sparkpoint-bench]

Adaptations of nexmark-flink's SQL: the three streams are `filesystem` tables with format `parquet`
over DIR/person, DIR/auction, DIR/bid (bounded: the job finishes when the files are read; at the end
of input Flink's watermark jumps to the end, so every window fires), `dateTime` as TIMESTAMP_LTZ(3)
(the files' UTC instants; the session time zone is UTC) with the watermark `dateTime - INTERVAL '4'
SECOND`; nexmark-flink's `customTime` column is `dateTime`; sinks are `blackhole` (q10's partitioned
filesystem sink too); q14's Java UDF `count_char(extra, 'c')` is
`CHAR_LENGTH(extra) - CHAR_LENGTH(REPLACE(extra, 'c', ''))`. q6 is not run by nexmark-flink (its OVER
window cannot consume the rank's updates) and q12 reads PROCTIME(), which this bounded file input
reads in well under one 10 s window: both are reported as `cannot_express`. q13 reads the side
input as a filesystem CSV table in a regular join (nexmark-flink: a lookup join FOR SYSTEM_TIME AS OF).
The Parquet format and the filesystem connector need flink-sql-parquet and Hadoop's client jars
(`--jars`, fetched from Maven Central by bench/pyflink/setup.sh).

State backend hashmap, checkpoints every 1 s, parallelism 2; measured as bench/pyflink/w1_flink.py
measures (its `run_once` fields: events/s from the JobManager log, checkpoints from the REST API).
`--files-per-epoch` is accepted for the command line bench/nexmark.py passes to every system and
unused: a file source split is one file, read as fast as the job goes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import w1_flink  # noqa: E402
from process_tree import tree_cpu_s  # noqa: E402

STREAMS = {
    "person": "id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING, state STRING, "
              "`dateTime` TIMESTAMP_LTZ(3), extra STRING",
    "auction": "id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, "
               "`dateTime` TIMESTAMP_LTZ(3), expires TIMESTAMP_LTZ(3), seller BIGINT, category BIGINT, extra STRING",
    "bid": "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, `url` STRING, `dateTime` TIMESTAMP_LTZ(3), "
           "extra STRING",
}
CANNOT_EXPRESS = {
    "q6": "nexmark-flink does not run q6: its OVER window cannot consume the updates of the winning-bid rank",
    "q12": "PROCTIME() windows over bounded file input: the files are read in well under one 10 s window, so "
           "the query measures nothing comparable",
}


def _by_price_rank(counted: str, name: str) -> str:
    """`counted` in all and in each of the three price ranks of q15-q17, as nexmark-flink names them."""
    return (f"{counted} AS total_{name}, {counted} filter (where price < 10000) AS rank1_{name}, "
            f"{counted} filter (where price >= 10000 and price < 1000000) AS rank2_{name}, "
            f"{counted} filter (where price >= 1000000) AS rank3_{name}")


# The bids, bidders and auctions of q15 and q16, each in all and by price rank.
_RANKED_COUNTS = ", ".join(_by_price_rank(counted, name) for counted, name in (
    ("count(*)", "bids"), ("count(distinct bidder)", "bidders"), ("count(distinct auction)", "auctions")))

# nexmark-flink's queries (the SELECT part, with dateTime for customTime); sinks are blackhole.
QUERIES = {
    "q0": "SELECT auction, bidder, price, `dateTime`, extra FROM bid",
    "q1": "SELECT auction, bidder, 0.908 * price AS price, `dateTime`, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0",
    "q3": "SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS P on A.seller = P.id "
          "WHERE A.category = 10 and (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')",
    "q4": "SELECT Q.category, AVG(Q.final) FROM (SELECT MAX(B.price) AS final, A.category FROM auction A, bid B "
          "WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires GROUP BY A.id, A.category) Q "
          "GROUP BY Q.category",
    "q5": "SELECT AuctionBids.auction, AuctionBids.num FROM (SELECT auction, count(*) AS num, window_start AS "
          "starttime, window_end AS endtime FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, "
          "INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end) AS AuctionBids JOIN (SELECT "
          "max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime FROM (SELECT count(*) AS num, "
          "window_start AS starttime, window_end AS endtime FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), "
          "INTERVAL '2' SECOND, INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end) AS CountBids "
          "GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids ON AuctionBids.starttime = MaxBids.starttime "
          "AND AuctionBids.endtime = MaxBids.endtime AND AuctionBids.num >= MaxBids.maxn",
    "q7": "SELECT B.auction, B.bidder, B.price, B.`dateTime`, B.extra FROM bid B JOIN (SELECT MAX(price) AS maxprice, "
          "window_end as `dateTime` FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND)) "
          "GROUP BY window_start, window_end) B1 ON B.price = B1.maxprice WHERE B.`dateTime` BETWEEN "
          "B1.`dateTime` - INTERVAL '10' SECOND AND B1.`dateTime`",
    "q8": "SELECT P.id, P.name, P.starttime FROM (SELECT id, name, window_start AS starttime, window_end AS endtime "
          "FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND)) GROUP BY id, name, "
          "window_start, window_end) P JOIN (SELECT seller, window_start AS starttime, window_end AS endtime FROM "
          "TABLE(TUMBLE(TABLE auction, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND)) GROUP BY seller, "
          "window_start, window_end) A ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime",
    "q9": "SELECT id, itemName, description, initialBid, reserve, `dateTime`, expires, seller, category, extra, "
          "auction, bidder, price, bid_dateTime, bid_extra FROM (SELECT A.*, B.auction, B.bidder, B.price, "
          "B.`dateTime` AS bid_dateTime, B.extra AS bid_extra, ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY "
          "B.price DESC, B.`dateTime` ASC) AS rownum FROM auction A, bid B WHERE A.id = B.auction AND B.`dateTime` "
          "BETWEEN A.`dateTime` AND A.expires) WHERE rownum <= 1",
    "q10": "SELECT auction, bidder, price, `dateTime`, extra, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd'), "
           "DATE_FORMAT(`dateTime`, 'HH:mm') FROM bid",
    "q11": "SELECT B.bidder, count(*) as bid_count, SESSION_START(B.`dateTime`, INTERVAL '10' SECOND) as starttime, "
           "SESSION_END(B.`dateTime`, INTERVAL '10' SECOND) as endtime FROM bid B GROUP BY B.bidder, "
           "SESSION(B.`dateTime`, INTERVAL '10' SECOND)",
    "q13": "SELECT B.auction, B.bidder, B.price, B.`dateTime`, S.`value` FROM bid B JOIN side_input AS S "
           "ON mod(B.auction, 10000) = S.key",
    "q14": "SELECT auction, bidder, 0.908 * price as price, CASE WHEN HOUR(`dateTime`) >= 8 AND HOUR(`dateTime`) <= 18 "
           "THEN 'dayTime' WHEN HOUR(`dateTime`) <= 6 OR HOUR(`dateTime`) >= 20 THEN 'nightTime' ELSE 'otherTime' "
           "END AS bidTimeType, `dateTime`, extra, CAST(CHAR_LENGTH(extra) - CHAR_LENGTH(REPLACE(extra, 'c', '')) "
           "AS BIGINT) AS c_counts FROM bid WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000",
    "q15": f"SELECT DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') as `day`, {_RANKED_COUNTS} "
           "FROM bid GROUP BY DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')",
    "q16": "SELECT channel, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') as `day`, max(DATE_FORMAT(`dateTime`, 'HH:mm')) "
           f"as `minute`, {_RANKED_COUNTS} FROM bid GROUP BY channel, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')",
    "q17": f"SELECT auction, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') as `day`, {_by_price_rank('count(*)', 'bids')}, "
           "min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price, sum(price) AS sum_price "
           "FROM bid GROUP BY auction, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')",
    "q18": "SELECT auction, bidder, price, channel, `url`, `dateTime`, extra FROM (SELECT *, ROW_NUMBER() OVER "
           "(PARTITION BY bidder, auction ORDER BY `dateTime` DESC) AS rank_number FROM bid) WHERE rank_number <= 1",
    "q19": "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number "
           "FROM bid) WHERE rank_number <= 10",
    "q20": "SELECT auction, bidder, price, channel, `url`, B.`dateTime`, B.extra, itemName, description, initialBid, "
           "reserve, A.`dateTime`, expires, seller, category, A.extra FROM bid AS B INNER JOIN auction AS A on "
           "B.auction = A.id WHERE A.category = 10",
    "q21": "SELECT auction, bidder, price, channel, CASE WHEN lower(channel) = 'apple' THEN '0' "
           "WHEN lower(channel) = 'google' THEN '1' WHEN lower(channel) = 'facebook' THEN '2' "
           "WHEN lower(channel) = 'baidu' THEN '3' ELSE REGEXP_EXTRACT(`url`, '(&|^)channel_id=([^&]*)', 2) END "
           "AS channel_id FROM bid where REGEXP_EXTRACT(`url`, '(&|^)channel_id=([^&]*)', 2) is not null or "
           "lower(channel) in ('apple', 'google', 'facebook', 'baidu')",
}


# The streams each query reads (its events: their rows); the others read bid only.
READS = {"q3": ("person", "auction"), "q4": ("auction", "bid"), "q8": ("person", "auction"),
         "q9": ("auction", "bid"), "q20": ("bid", "auction")}


def parquet_rows(path: str) -> int:
    """Rows of the stream's files, from their footers (pyarrow is in the PyFlink venv too)."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(os.path.join(path, f)).metadata.num_rows for f in os.listdir(path)
               if f.endswith(".parquet"))


def create_tables(t_env, input_dir: str, side_input: str) -> None:
    for name, columns in STREAMS.items():
        t_env.execute_sql(f"CREATE TABLE {name} ({columns}, WATERMARK FOR `dateTime` AS `dateTime` - "
                          f"INTERVAL '4' SECOND) WITH ('connector' = 'filesystem', 'path' = "
                          f"'file://{os.path.join(input_dir, name)}', 'format' = 'parquet')")
    t_env.execute_sql(f"CREATE TABLE side_input (key BIGINT, `value` STRING) WITH ('connector' = 'filesystem', "
                      f"'path' = 'file://{side_input}', 'format' = 'csv')")


def run_query(query: str, input_dir: str, side_input: str, jars: list[str], work: str,
              log_dir: str) -> dict[str, Any]:
    from pyflink.table import TableDescriptor

    root = os.path.join(work, f"nexmark-{query}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    port = w1_flink.free_port()
    env, t_env, settings = w1_flink.table_env("hashmap", True, root, port)
    t_env.get_config().set("pipeline.jars", ";".join("file://" + j for j in jars))
    t_env.get_config().set("table.local-time-zone", "UTC")
    create_tables(t_env, input_dir, side_input)
    select = QUERIES[query]
    events = sum(parquet_rows(os.path.join(input_dir, s)) for s in READS.get(query, ("bid",)))
    offsets = w1_flink.log_offsets(log_dir)
    sampler = w1_flink.RssSampler()
    sampler.start()
    started, cpu0 = time.monotonic(), tree_cpu_s()
    # A blackhole sink shaped like the query's result (no schema given: the table's is used).
    result = t_env.sql_query(select).execute_insert(TableDescriptor.for_connector("blackhole").build())
    job_client = result.get_job_client()
    job_id = str(job_client.get_job_id())
    polled = w1_flink.poll_job(port, job_id, job_client)
    job_client.get_job_execution_result().result()
    wall, cpu = time.monotonic() - started, tree_cpu_s() - cpu0
    peak = sampler.stop()
    time.sleep(0.3)  # let the log flush the job's last lines
    log = w1_flink.parse_job_log(w1_flink.read_log(log_dir, offsets), job_id)
    if log["all_running"] is None or log["job_finished"] is None:
        raise RuntimeError(f"job {job_id}: no RUNNING/FINISHED times in the log under {log_dir}")
    run_s = log["job_finished"] - log["all_running"]
    durations = {i: c["end_to_end_duration"] for i, c in polled["checkpoints"].items() if c["status"] == "COMPLETED"}
    for i, c in log["completed"].items():
        durations.setdefault(i, c["duration_ms"])
    d = list(durations.values())
    shutil.rmtree(root, ignore_errors=True)
    return {
        "system": "pyflink", "config": "hashmap-ckpt-1s", "query": query, "events": events,
        "events_per_s": events / run_s if run_s > 0 else None, "run_s": run_s, "wall_s": wall,
        "events_per_s_incl_startup": events / wall,
        "ckpt_p50_ms": w1_flink.percentile(d, 50), "ckpt_p99_ms": w1_flink.percentile(d, 99),
        "checkpoints_completed": len(d), "peak_rss_mb": peak / 2**20, "cpu_s": cpu,
        "cpu_s_per_m_events": 1e6 * cpu / events if events else None, "flink_version": w1_flink.flink_version(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--jars", required=True, help="directory of flink-sql-parquet and Hadoop client jars")
    p.add_argument("--files-per-stream", type=int, default=20)
    p.add_argument("--files-per-epoch", type=int, default=2, help="accepted and unused (see the docstring)")
    p.add_argument("--work", default="/tmp/sparkpoint-bench")
    args = p.parse_args()
    input_dir = os.path.join(os.path.abspath(args.work), f"nexmark-{args.events}-{args.files_per_stream}")
    if not os.path.exists(os.path.join(input_dir, "complete")):
        raise SystemExit(f"{input_dir} is not complete: bench/nexmark.py generates it before running PyFlink")
    jars = sorted(os.path.join(args.jars, j) for j in os.listdir(args.jars) if j.endswith(".jar"))
    side = os.path.join(os.path.abspath(args.work), "nexmark-side-input.csv")
    if not os.path.exists(side):
        with open(side, "w") as f:
            f.writelines(f"{k},{k}\n" for k in range(10_000))
    work = os.path.join(os.path.abspath(args.work), f"pyflink-nexmark-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    dirs = w1_flink.prepare_flink_home(work)
    for query in [q.strip() for q in args.queries.split(",") if q.strip()]:
        if query in CANNOT_EXPRESS:
            result = {"system": "pyflink", "config": "hashmap-ckpt-1s", "query": query,
                      "cannot_express": CANNOT_EXPRESS[query]}
        else:
            try:
                result = run_query(query, input_dir, side, jars, work, dirs["log"])
            except Exception as e:  # noqa: BLE001 — one query's failure is its row, the others still run
                result = {"system": "pyflink", "config": "hashmap-ckpt-1s", "query": query, "failed": repr(e)[:2000]}
        result["loadavg_1m_after"] = os.getloadavg()[0]
        print("RESULT " + json.dumps(result), flush=True)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
