"""End-to-end latency at a steady input rate on Spark Structured Streaming in Real-time
Mode (`trigger(realTime=...)`, Spark 4.3), the same W1-shaped keyed aggregate as
bench/latency.py (count + sum per key over K keys), locally (local[2]).

    python bench/latency_spark_rtm.py [--rate 50000] [--duration-s 60] [--keys 100000]
        [--skip-s 10] [--warm-ms 1000] [--checkpoint-interval "5 seconds"] [--work /tmp/sparkpoint-bench]

Real-time Mode reads only from Kafka and writes only to Kafka or a foreach sink, so the
pipeline is Kafka in / Kafka out on a real single-node broker (tests/servers/kafka_broker.py)
that this script starts on 127.0.0.1 and stops:
  - a producer process writes event g at T0 + g / rate (the rate actually achieved is
    reported: `rate_achieved`), key = (g * 2654435761) mod K, value "v,send_ms" with
    v = (g * 40503) mod 1000 and send_ms the wall time the event was handed to the producer;
  - the query reads the topic, groups by key: count, sum(v), max(send_ms), in update mode,
    and writes each updated row to an output topic (Spark's Kafka sink);
  - a consumer process records the wall time each output record arrives.

Output guarantee: Spark's Kafka sink is NOT exactly-once. It writes with a plain
(non-transactional) producer, so after a failure the records written since the last
checkpoint are written again: at-least-once. The numbers here are therefore not
comparable one-to-one with an exactly-once pipeline's; the RESULT's config says so.

Latency per event = the arrival time (at the consumer) of the first output record for
its key whose max(send_ms) >= the event's send_ms, minus the event's send_ms. It includes
the producer → broker → Spark → broker → consumer hops. Before the run the producer
sends probe records (a key outside the K keys) until one comes back within --warm-ms: the
first Real-time Mode tasks take seconds to start, and events sent before then would only
measure that backlog; the first seconds at the full rate still drain some (JIT, first
state-store and producer buffers), hence --skip-s 10. p50/p99/max/mean over the events sent after the first --skip-s
seconds of the run and within --duration-s; `events_without_output` counts measured events no output record
answered before the drain timeout (they are not in the percentiles). A query that cannot
keep up with --rate builds a backlog: its latencies grow through the run, events go
unanswered and `kept_up` is false; such a RESULT measures the backlog, not the latency
(lower --rate). Real-time Mode emits one output record per input record in update
mode, so the Kafka sink writes --rate records/s too. A Real-time Mode batch ends at
each checkpoint interval and the next batch starts new tasks: output pauses at every
boundary, which shows in the p99 (about 1 s every 5 s on 2 busy cores).

The connector: Spark's Kafka connector 4.3.0 is not on Maven Central (as of this
writing its newest version there is 4.2.0), so the script uses the jars that
`scripts/fetch_kafka.sh --spark-connector` puts in .cache/kafka/spark-connector (4.2.0,
whose Kafka source implements SupportsRealTimeMode) on pyspark 4.3.0.

If Real-time Mode refuses the query, the script prints a RESULT with "error" set to
Spark's exact refusal and exits 1.

Prints one `RESULT {json}` line with the fields of bench/latency.py: system
"spark-ss-rtm", config, workload "latency", rate, latency_p50_ms, latency_p99_ms,
latency_max_ms, latency_mean_ms, events, events_measured, commits (Real-time Mode
batches committed, i.e. checkpoints), peak_rss_mb (this driver and Spark's JVM; the
broker, producer and consumer are left out), loadavg_1m_after.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from process_tree import PeakRss, tree_rss  # noqa: E402

IN_TOPIC, OUT_TOPIC = "events", "updates"
KEY_MULT, VALUE_MULT = 2654435761, 40503
CONFIG = "real-time mode, Kafka in/out, at-least-once output (Spark's Kafka sink)"


def event_keys(g: np.ndarray, keys: int) -> np.ndarray:
    return (g * KEY_MULT) % keys


# -- producer and consumer (own processes: neither competes with the driver for the GIL) ----
def warm_up(producer, keys: int, last_max_ms, warm_ms: float, timeout_s: float) -> float:
    """Probe records (key `keys`, outside the measured keys) every 100 ms until one comes
    back through the query within `warm_ms`: the Real-time Mode tasks are scheduled and
    past their start-up. Returns the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        probe_ms = int(time.time() * 1000)
        producer.produce(IN_TOPIC, key=b"%d" % keys, value=b"0,%d" % probe_ms)
        producer.flush(10)
        while time.time() * 1000 - probe_ms < max(warm_ms, 100):
            if last_max_ms.value >= probe_ms:
                return time.monotonic() - started
            time.sleep(0.01)
    raise TimeoutError(f"no probe came back through the query within {warm_ms:.0f} ms in {timeout_s:.0f} s")


def produce(bootstrap: str, rate: int, duration_s: float, keys: int, out_path: str, last_max_ms,
            warm_ms: float) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": 1,
                         "queue.buffering.max.messages": 2_000_000})
    warm_s = warm_up(producer, keys, last_max_ms, warm_ms, timeout_s=300)
    total = int(rate * duration_s)
    send_ms = np.empty(total, dtype=np.int64)
    g = 0
    started = time.time()
    while g < total:
        due = min(total, int((time.time() - started) * rate) + 1)
        if g >= due:
            producer.poll(0)
            time.sleep(0.0005)
            continue
        while g < due:
            now_ms = int(time.time() * 1000)
            try:
                producer.produce(IN_TOPIC, key=b"%d" % ((g * KEY_MULT) % keys),
                                 value=b"%d,%d" % ((g * VALUE_MULT) % 1000, now_ms))
            except BufferError:
                producer.poll(0.01)
                continue
            send_ms[g] = now_ms
            g += 1
        producer.poll(0)
    sent_s = time.time() - started
    left = producer.flush(60)
    np.savez(out_path, send_ms=send_ms, started=started, sent_s=sent_s, unflushed=left, warm_s=warm_s)


def consume(bootstrap: str, out_path: str, stop, last_max_ms) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "latency-probe",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 5,
                         "isolation.level": "read_uncommitted"})
    consumer.assign([TopicPartition(OUT_TOPIC, 0, 0)])
    arrival, key, max_ms = [], [], []
    while not stop.is_set():
        msgs = consumer.consume(num_messages=10_000, timeout=0.05)
        now_ms = time.time() * 1000
        newest = 0
        for m in msgs:
            if m.error():
                continue
            arrival.append(now_ms)
            key.append(int(m.key()))
            ts = int(m.value().rsplit(b",", 1)[1])
            max_ms.append(ts)
            newest = max(newest, ts)
        if newest > last_max_ms.value:
            last_max_ms.value = newest
    consumer.close()
    np.savez(out_path, arrival=np.array(arrival, dtype=np.float64), key=np.array(key, dtype=np.int64),
             max_ms=np.array(max_ms, dtype=np.int64))


# -- latency ------------------------------------------------------------------------------------
def latencies(send_ms: np.ndarray, keys_of_events: np.ndarray, out: dict[str, np.ndarray]) -> np.ndarray:
    """Per event: arrival of the first output record of its key with max(send_ms) >= its
    send_ms, minus its send_ms; NaN where no such record arrived."""
    base = int(min(send_ms.min(), out["max_ms"].min() if len(out["max_ms"]) else send_ms.min())) - 1
    order = np.lexsort((out["arrival"], out["key"]))  # by key, then arrival
    o_key, o_arr, o_max = out["key"][order], out["arrival"][order], out["max_ms"][order] - base
    # Running max per key: a later record can carry a smaller max only after a replay
    # (at-least-once); the first record reaching a time stays the one that answered. With
    # the key in the high bits (offsets stay far below 2^42 ms), a plain running max over
    # the key-sorted records restarts at each key.
    shift = np.int64(1) << 42
    composite = np.maximum.accumulate(o_key * shift + o_max)
    wanted = keys_of_events * shift + (send_ms - base)
    idx = np.searchsorted(composite, wanted, side="left")
    found = idx < len(composite)
    found[found] &= o_key[idx[found]] == keys_of_events[found]
    lat = np.full(len(send_ms), np.nan)
    lat[found] = o_arr[idx[found]] - send_ms[found]
    return lat


def _percentiles(lat_ms: np.ndarray) -> dict[str, Any]:
    if not len(lat_ms):
        return {"latency_p50_ms": None, "latency_p99_ms": None, "latency_max_ms": None, "latency_mean_ms": None}
    return {"latency_p50_ms": round(float(np.percentile(lat_ms, 50)), 1),
            "latency_p99_ms": round(float(np.percentile(lat_ms, 99)), 1),
            "latency_max_ms": round(float(lat_ms.max()), 1),
            "latency_mean_ms": round(float(lat_ms.mean()), 1)}


class SparkRss(PeakRss):
    """PeakRss of this process tree without the broker, producer and consumer trees."""

    def __init__(self) -> None:
        self.excluded: list[int] = []
        super().__init__()

    def _sample(self) -> None:
        total, by_name = tree_rss()
        for pid in list(self.excluded):
            total -= tree_rss(pid)[0]
        if total >= self._peak:
            self._peak, self.breakdown = total, by_name


# -- the run ------------------------------------------------------------------------------------
def spark_session(shuffle_partitions: int):
    from pyspark.sql import SparkSession

    from sparkpoint.connectors.kafka_common import spark_connector_jars

    return (SparkSession.builder.master("local[2]").appName("bench-latency-spark-rtm")
            .config("spark.jars", ",".join(spark_connector_jars()))
            .config("spark.sql.shuffle.partitions", shuffle_partitions)
            .config("spark.sql.adaptive.enabled", "false")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate())


def start_query(spark, bootstrap: str, args, ckpt: str):
    from pyspark.sql import functions as F

    events = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", IN_TOPIC).option("startingOffsets", "earliest").load()
              .select(F.col("key").cast("string").cast("long").alias("key"),
                      F.split(F.col("value").cast("string"), ",").alias("p"))
              .select("key", F.col("p")[0].cast("long").alias("v"), F.col("p")[1].cast("long").alias("send_ms")))
    agg = events.groupBy("key").agg(F.count(F.lit(1)).alias("count"), F.sum("v").alias("sum"),
                                    F.max("send_ms").alias("last_ms"))
    out = agg.select(F.col("key").cast("string").alias("key"),
                     F.concat_ws(",", "count", "sum", "last_ms").alias("value"))
    return (out.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("topic", OUT_TOPIC).option("checkpointLocation", ckpt)
            .outputMode("update").trigger(realTime=args.checkpoint_interval).start())


def wait_running(q, timeout_s: float) -> None:
    """Until the Real-time Mode batch has its tasks running (or the query failed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if q.exception() is not None or not q.isActive:
            return
        if q.status.get("isTriggerActive"):
            return
        time.sleep(0.2)


def refusal(q, exc: BaseException | None) -> str | None:
    if exc is not None:
        return str(exc).strip()
    if q is not None and q.exception() is not None:
        return str(q.exception()).strip()
    return None


def run(args) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.servers.kafka_broker import KafkaBroker, ensure_kafka_jars

    root = Path(args.work) / "latency-spark-rtm"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    ensure_kafka_jars(spark_connector=True)
    rss = SparkRss()
    broker = KafkaBroker(root / "broker").start()
    ctx = mp.get_context("spawn")
    q = None
    spark = None
    try:
        rss.excluded.append(broker._process.pid)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        for f in admin.create_topics([NewTopic(IN_TOPIC, args.partitions, 1), NewTopic(OUT_TOPIC, 1, 1)]).values():
            f.result(60)
        del admin  # its connection would log "Connection refused" once the broker is stopped
        spark = spark_session(args.shuffle_partitions)
        spark.sparkContext.setLogLevel("ERROR")
        ckpt = str(root / "checkpoint")
        error = None
        try:
            q = start_query(spark, broker.bootstrap_servers, args, ckpt)
            wait_running(q, 120)
            time.sleep(2)  # a refusal at planning time shows up right after start
            error = refusal(q, None)
        except Exception as exc:  # noqa: BLE001 - Spark's refusal is the result to report
            error = refusal(q, exc)
        if error is not None:
            return {"system": "spark-ss-rtm", "config": CONFIG, "workload": "latency", "rate": args.rate,
                    "error": error}

        stop, last_max_ms = ctx.Event(), ctx.Value("q", 0)
        consumer = ctx.Process(target=consume, args=(broker.bootstrap_servers, str(root / "out.npz"),
                                                     stop, last_max_ms), daemon=True)
        consumer.start()
        rss.excluded.append(consumer.pid)
        producer = ctx.Process(target=produce, args=(broker.bootstrap_servers, args.rate, args.duration_s,
                                                     args.keys, str(root / "in.npz"), last_max_ms, args.warm_ms),
                               daemon=True)
        rss.reset()
        producer.start()
        rss.excluded.append(producer.pid)
        producer.join(args.duration_s + 600)
        if producer.exitcode != 0:
            raise RuntimeError(f"the producer failed (exit code {producer.exitcode})")
        sent = np.load(root / "in.npz")
        send_ms = sent["send_ms"]
        # Drain: until an output record covers the last event sent, or the timeout.
        deadline = time.monotonic() + args.drain_s
        while last_max_ms.value < send_ms[-1] and time.monotonic() < deadline:
            if q.exception() is not None:
                break
            time.sleep(0.1)
        peak = rss.peak_mb
        stop.set()
        consumer.join(60)
        error = refusal(q, None)
        commits = len([p for p in (Path(ckpt) / "commits").glob("*") if p.name.isdigit()])
        q.stop()
        q = None
    finally:
        if q is not None:
            q.stop()
        if spark is not None:
            spark.stop()
        broker.stop()
        rss.stop()
    out = dict(np.load(root / "out.npz"))
    g = np.arange(len(send_ms), dtype=np.int64)
    lat = latencies(send_ms, event_keys(g, args.keys), out)
    start_ms = float(sent["started"]) * 1000
    keep = (send_ms >= start_ms + args.skip_s * 1000) & (send_ms < start_ms + args.duration_s * 1000)
    answered = keep & ~np.isnan(lat)
    result = {"system": "spark-ss-rtm", "config": CONFIG, "workload": "latency", "rate": args.rate,
              "rate_achieved": round(len(send_ms) / float(sent["sent_s"]), 1),
              **_percentiles(lat[answered]), "events": int(len(send_ms)), "events_measured": int(answered.sum()),
              "events_without_output": int((keep & np.isnan(lat)).sum()),
              "kept_up": bool(not (keep & np.isnan(lat)).any()), "output_records": int(len(out["key"])),
              "keys": args.keys, "duration_s": args.duration_s, "commits": commits,
              "checkpoint_interval": args.checkpoint_interval, "input_partitions": args.partitions,
              "shuffle_partitions": args.shuffle_partitions, "warm_up_s": round(float(sent["warm_s"]), 1),
              "peak_rss_mb": peak}
    if error is not None:
        result["error"] = error
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=50_000, help="events per second")
    parser.add_argument("--duration-s", type=float, default=60)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--skip-s", type=float, default=10,
                        help="events of the first seconds are not measured (the query still drains its "
                             "start-up backlog for several seconds after the warm-up probes)")
    parser.add_argument("--drain-s", type=float, default=30, help="wait at most this long for the last output")
    parser.add_argument("--warm-ms", type=float, default=1000,
                        help="before the run, probe until one record comes back through the query within this")
    parser.add_argument("--checkpoint-interval", default="5 seconds",
                        help="the realTime trigger's batch duration (a checkpoint interval, not a latency target)")
    parser.add_argument("--partitions", type=int, default=1, help="input topic partitions (source tasks)")
    parser.add_argument("--shuffle-partitions", type=int, default=1,
                        help="aggregation tasks; source + shuffle tasks must all fit in local[2]'s 2 slots")
    parser.add_argument("--work", default="/tmp/sparkpoint-bench")
    parser.add_argument("--keep", action="store_true", help="keep the broker data and checkpoint")
    args = parser.parse_args()
    result = run(args)
    result["loadavg_1m_after"] = os.getloadavg()[0]
    print("RESULT " + json.dumps(result), flush=True)
    if "error" in result and result.get("latency_p50_ms") is None:
        sys.exit(1)


if __name__ == "__main__":
    main()
