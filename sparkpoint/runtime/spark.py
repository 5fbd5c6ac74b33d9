"""The job's Spark session: the one it is handed, else one it creates.

A session handed to the job (`pipeline.run(spark=session)`, or the active session when
`sparkpoint.run` is called inside one) is used as it is: sparkpoint changes none of its
settings and never stops it. What the job needs for correctness it does per query (the
session's time zone is read where Arrow needs it, the shuffle into subtasks names its
partition count), never through the session's conf.

A session sparkpoint creates gets `own_settings` under the user's `spark.conf`. Its master
is `spark.master` if set, else the one spark-submit was given, else `local[2]`. Only on a
local master is the driver pinned to loopback and are the Python workers this interpreter:
on a cluster both are the user's to set (docs/deploy.md)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from sparkpoint.errors import ConfigError, SparkpointError

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[2]"


class ExecutorsUnreachableError(SparkpointError):
    """No executor registered with the driver: set spark.driver.host to an address of the
    driver's machine that the workers reach, or give the cluster free cores."""


@dataclass(frozen=True)
class SparkSetting:
    key: str
    value: str
    why: str


def own_settings(master: str, parallelism: int) -> list[SparkSetting]:
    """What sparkpoint sets in a session it creates, and why (listed in docs/deploy.md;
    `spark.conf` overrides any of them)."""
    settings = [
        SparkSetting("spark.sql.shuffle.partitions", str(parallelism),
                     "the pre-aggregation before the stateful step shuffles into as many partitions as "
                     "there are subtasks, not Spark's 200 mostly empty ones"),
        SparkSetting("spark.default.parallelism", str(parallelism), "the same for RDD steps"),
        SparkSetting("spark.sql.adaptive.enabled", "false",
                     "epochs are small and repeated; adaptive re-planning costs more than it saves there "
                     "(correctness does not depend on it)"),
        SparkSetting("spark.sql.session.timeZone", "UTC",
                     "timestamps shown and parsed in UTC, the zone of state and event time"),
        SparkSetting("spark.python.worker.reuse", "true",
                     "a Python worker keeps the state stores it opened between epochs (Spark's default, "
                     "made explicit)"),
        SparkSetting("spark.ui.showConsoleProgress", "false", "Spark's progress bar would break the job's own "
                     "progress line"),
        SparkSetting("spark.driver.memory", "2g",
                     "room for the driver's checkpoint coordination next to Spark; only takes effect when "
                     "sparkpoint starts the JVM (not under spark-submit, which sizes the driver itself)"),
    ]
    if is_local(master):
        settings += [
            SparkSetting("spark.ui.enabled", "false", "a local run needs no Spark UI port (the job's "
                         "dashboard is on rest.port)"),
            SparkSetting("spark.driver.bindAddress", "127.0.0.1",
                         "a local run needs no network: nothing listens beyond loopback"),
            SparkSetting("spark.driver.host", "127.0.0.1", "the same, advertised"),
        ]
    return settings


def is_local(master: str | None) -> bool:
    return master is None or master.startswith("local")


def check_java() -> str:
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    if not java or not os.path.exists(java):
        raise ConfigError("Java 17 is required to run Spark but no `java` was found: install a JDK 17 "
                          "(e.g. `apt-get install openjdk-17-jdk-headless`) or set JAVA_HOME")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    first = out.splitlines()[0] if out else ""
    if '"1.' in first or any(f'"{v}' in first for v in ("9", "10", "11", "12", "13", "14", "15", "16")):
        raise ConfigError(f"Spark 4 needs Java 17 or newer; found {first!r}. Point JAVA_HOME at a JDK 17")
    return first


# ---------------------------------------------------------------- which session, which master
def active_session():
    """The session active on this thread, if this process has one (a notebook's, a
    spark-submit script's, a session the user built); None without starting anything."""
    if "pyspark" not in sys.modules:
        return None
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def session_master(spark) -> str | None:
    """The master of a session the job was handed (None if it does not say)."""
    try:
        return spark.conf.get("spark.master", None) or None
    except Exception:  # noqa: BLE001 - a session that cannot answer: treated as the configured master
        return None


def submitted_master() -> str | None:
    """The master spark-submit was given, when spark-submit started this Python process
    (its JVM is already running and holds the conf); else None."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return SparkConf().get("spark.master", None)


def master_to_create(configured: str | None) -> str:
    """`spark.master` if set, else spark-submit's `--master`, else local[2]."""
    return configured or submitted_master() or DEFAULT_MASTER


# ---------------------------------------------------------------- a session of sparkpoint's own
def create_session(master: str, app_name: str = "sparkpoint", parallelism: int = 2,
                   user_conf: dict[str, str] | None = None, remote: str | None = None):
    """Get or create a session with `own_settings` under `user_conf`. If this process
    already has a session, Spark hands that one back with its settings unchanged apart
    from runtime SQL settings: callers that want the user's session use it directly.
    `remote` (or Spark's SPARK_REMOTE): a session on that Spark Connect server instead."""
    remote = remote or os.environ.get("SPARK_REMOTE")
    if remote:
        from sparkpoint.runtime.connect import connect_session

        return connect_session(remote, parallelism, user_conf)
    check_java()
    if is_local(master):
        # A local run binds to loopback and its workers are this interpreter (another
        # Python might lack pyarrow). On a cluster neither holds: Spark's defaults stand
        # unless the user sets them (docs/deploy.md).
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for setting in own_settings(master, parallelism):
        builder = builder.config(setting.key, setting.value)
    for k, v in (user_conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    from sparkpoint.runtime.connect import is_connect

    if not is_connect(spark):  # a Connect session logs on its server: nothing to quiet here
        spark.sparkContext.setLogLevel("ERROR")
        _quiet_task_failures(spark)
    return spark


def get_or_create_spark(master: str = DEFAULT_MASTER, app_name: str = "sparkpoint", shuffle_partitions: int = 2,
                        extra_conf: dict[str, str] | None = None, remote: str | None = None):
    """A session of sparkpoint's own (tests and benchmarks use it directly)."""
    return create_session(master, app_name, shuffle_partitions, extra_conf, remote=remote)


def _quiet_task_failures(spark) -> None:
    """A task that fails makes Spark log its whole Java and Python trace (~45 lines) once
    per attempt. The job master reports every failure itself, in one line, with the full
    trace written to a file: Spark's copy would bury that line. A Python worker that fails
    while Spark streams Arrow batches to it also makes a task completion listener log the
    Arrow allocator's leak check with a Java trace; an error of a completion listener
    fails its task, which the job master reports like any failed task."""
    try:
        jvm = spark.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.OFF
        for name in ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager",
                     "org.apache.spark.TaskContextImpl", "org.apache.arrow.memory.BaseAllocator"):
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
    except Exception:  # another logging backend: Spark's messages stay as they are
        pass


# ---------------------------------------------------------------- executors that reach the driver
def await_executors(spark, timeout_ms: int, clock=time.monotonic, sleep=time.sleep) -> None:
    """On a cluster master, wait until a first executor registered with the driver. An
    executor that cannot connect back to the driver (a driver advertised on an address the
    workers do not reach) never registers, and Spark itself only repeats "Initial job has
    not accepted any resources" for ever: this says what to check, once, and stops."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return  # a Spark Connect server places executors itself; the client has no driver to reach
    master = session_master(spark)
    if is_local(master) or timeout_ms <= 0:
        return
    if spark.conf.get("spark.dynamicAllocation.enabled", "false").lower() == "true":
        return  # executors come when there are tasks to run
    sc = spark.sparkContext._jsc.sc()
    deadline = clock() + timeout_ms / 1000
    while sc.getExecutorMemoryStatus().size() <= 1:  # the driver's own block manager counts
        if sc.isStopped():
            raise ExecutorsUnreachableError(_unreachable_line(spark, master, "Spark stopped the application "
                                                              "before any executor registered with the driver"))
        if clock() >= deadline:
            raise ExecutorsUnreachableError(_unreachable_line(
                spark, master, f"no executor registered with the driver within {timeout_ms / 1000:g} s"))
        sleep(0.5)


def _unreachable_line(spark, master: str, what: str) -> str:
    conf = spark.sparkContext.getConf()
    host, port = conf.get("spark.driver.host", "?"), conf.get("spark.driver.port", "?")
    return (f"{what} (master {master}, driver advertised at {host}:{port}): the executors most likely cannot "
            f"connect back to the driver. Set spark.conf.spark.driver.host to an address of this machine that "
            f"the workers reach (and spark.conf.spark.driver.bindAddress, e.g. 0.0.0.0, if it is not a local "
            f"interface), let the workers through to spark.driver.port, or check that the cluster has free "
            f"cores; see docs/deploy.md, 'Driver host'")
