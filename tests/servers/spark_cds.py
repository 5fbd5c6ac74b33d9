"""A class-data-sharing archive for the Spark driver JVMs of a test run.

Every `sparkpoint run` a test starts, and the in-process tier's session, start a Spark
driver JVM, and loading and verifying Spark's classes is most of what that costs. Java's
dynamic CDS archive maps the classes a driver loads from one file made once: on this
2-core machine a local session started in about 3 s instead of 5, and its first job took
2 s instead of 3.5 (quiet machine, 2026-11-26).

`python -m tests.servers.spark_cds` (run by `make test` before pytest) writes the archive
once per Java, PySpark and interpreter; `tests/conftest.py` hands it to every driver JVM
through PYSPARK_SUBMIT_ARGS, which the processes the tests start inherit. A JVM whose class
path differs from the archive's (a cluster test's SPARK_CONF_DIR, another virtualenv's
PySpark) runs without it, silently: the archive changes how long a start takes, never what
a test sees.

Every driver JVM of a test run, the in-process sessions' and the processes' the tests
start, also compiles with the client compiler only (`-XX:TieredStopAtLevel=1`), and so do
the test cluster's executors and daemons (tests/servers/spark_cluster.py). A job process
lives 20-60 s: C2 spends much of that compiling Spark's and Catalyst's methods and is done
too late to pay off. On this 2-core machine two job-process files took 100-108
CPU-seconds instead of 161-165, and 66-72 s instead of 92 s (2026-11-28). An in-process
session lives for its whole pytest process; C1 alone makes its tests run 6-9 % longer on
an idle machine but spend 9-17 % less CPU, and `make test` runs on two busy cores. There,
with the sessions and the cluster's daemons on C1 too, the whole run spent 3 % less CPU
and left more of it idle (the in-process tests took 680 s instead of 650, the servers'
tests beside them 730 s instead of 820-828), which the Makefile's three JVM processes
fill (clean-clone runs, 2026-11-28).
Neither flag changes what Spark computes; `make bench` uses neither.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE = REPO_ROOT / ".cache" / "spark-cds"
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

# What the archive is made from: a driver doing what sparkpoint's drivers do (Arrow
# batches in and out of Python, a shuffle, Parquet written and read).
_WORKLOAD = r"""
import sys, tempfile
import pyarrow as pa
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").appName("cds")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
df = spark.range(0, 2000).selectExpr("id % 13 AS key", "id AS value", "CAST(id AS STRING) AS s")
def per_key(table):
    return pa.table({"key": table.column("key").slice(0, 1), "n": pa.array([table.num_rows], pa.int64())})
counted = df.groupBy("key").applyInArrow(per_key, "key BIGINT, n BIGINT")
mapped = df.mapInArrow(lambda batches: (b for b in batches), df.schema)
with tempfile.TemporaryDirectory() as d:
    counted.write.parquet(d + "/counted")
    mapped.repartition(2, "key").write.parquet(d + "/mapped")
    spark.read.parquet(d + "/counted").join(spark.read.parquet(d + "/mapped"), "key").count()
spark.createDataFrame(pa.table({"a": [1, 2]}).to_pandas()).collect()
spark.stop()
"""


def archive_path() -> Path:
    """Where this interpreter's archive is (whether or not it exists yet)."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    key = "\n".join([java, pyspark.__version__, str(Path(pyspark.__file__).resolve()), sys.executable])
    return CACHE / f"driver-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


_C1_ONLY = "-XX:TieredStopAtLevel=1"


def submit_args(archive: Path | None) -> str:
    options = [f"-XX:SharedArchiveFile={archive}", _QUIET] if archive is not None else []
    return f"--driver-java-options '{' '.join([*options, _C1_ONLY])}' pyspark-shell"


def configure_test_jvms() -> None:
    """Give the driver JVMs of this process and its children the client compiler only and
    the archive, if it was made; unless something else sets PYSPARK_SUBMIT_ARGS, which is
    then left alone."""
    if "PYSPARK_SUBMIT_ARGS" in os.environ:
        return
    try:
        archive: Path | None = archive_path()
    except (OSError, ImportError):
        archive = None
    if archive is not None and not archive.is_file():
        archive = None
    os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args(archive)


def make() -> Path | None:
    """Write the archive unless it exists. A failure is reported and leaves none: the
    tests then start their JVMs the slow way."""
    archive = archive_path()
    if archive.is_file():
        return archive
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_SUBMIT_ARGS=f"--driver-java-options "
                                                                             f"'-XX:ArchiveClassesAtExit={partial} {_QUIET}' pyspark-shell")
    done = subprocess.run([sys.executable, "-c", _WORKLOAD], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        print(f"spark_cds: no class-data archive (JVM starts stay slower): {done.stderr[-1500:]}", file=sys.stderr)
        return None
    os.replace(partial, archive)
    return archive


if __name__ == "__main__":
    made = make()
    print(f"spark_cds: {made}" if made else "spark_cds: none")
