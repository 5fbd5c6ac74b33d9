"""A job driven through a Spark Connect server, in a process of its own (pyspark allows
one kind of session per process; the other integration tests hold a classic one).

    python connect_job.py URL ROOT --session config    spark.remote names the server
    python connect_job.py URL ROOT --session handed    the script connects and hands the
                                                       session to the job; its first epoch
                                                       fails once (a failover)

Prints one JSON line: the job's outcome and, for `handed`, the failure-free answer
computed in one batch query over every event."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from failure_support import Events, Tripwire, expected_windows  # noqa: E402

from sparkpoint import Settings  # noqa: E402
from sparkpoint.runtime.jobmaster import JobMaster  # noqa: E402

# Paced: a run spans several 1 s checkpoint intervals, so the test can kill it mid-way.
EVENTS = Events(keys=40, total=12_000, per_epoch=1_000, rate_per_s=1_500)
JOB = "over-connect"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("root", type=Path)
    parser.add_argument("--session", choices=("config", "handed"), required=True)
    args = parser.parse_args()
    out = {}
    if args.session == "config":
        # spark.executor.memory: a key a Connect client cannot set; the job says so and runs on.
        keys = {**_keys(args.root), "spark.remote": args.url, "spark.conf": {"spark.executor.memory": "1g"}}
        result = EVENTS.pipeline(JOB, args.root / "out", transform=Tripwire()).run(overrides=keys)
    else:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.remote(args.url).getOrCreate()
        trip = Tripwire()
        trip.arm()
        job = JobMaster(EVENTS.pipeline(JOB, args.root / "out", transform=trip),
                        Settings.load(overrides=_keys(args.root)), spark=spark)
        result = job.run()
        out["restored_from"] = None if job.restored_from is None else str(job.restored_from)
        out["expected"] = expected_windows(spark, EVENTS)
    out.update(status=result.status.name, restarts=result.restarts, records=result.records)
    print("RESULT " + json.dumps(out), flush=True)


def _keys(root: Path) -> dict:
    return {"pipeline.name": JOB, "execution.checkpointing.dir": str(root / "checkpoints"),
            "state.local.dir": str(root / "state"), "execution.checkpointing.interval": "1 s",
            "parallelism.default": 2, "sparkpoint.progress": False, "sparkpoint.lease.ttl": "3 s",
            "restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": "100 ms"}


if __name__ == "__main__":
    main()
