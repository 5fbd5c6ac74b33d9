"""The embedded Spark session: local[2] by default, shuffle partitions = parallelism,
Python workers on this interpreter (else they import a Python without pyarrow)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from sparkpoint.errors import ConfigError


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


def get_or_create_spark(master: str = "local[2]", app_name: str = "sparkpoint", shuffle_partitions: int = 2,
                        extra_conf: dict[str, str] | None = None, remote: str | None = None):
    """`remote` (or Spark's SPARK_REMOTE): a session on that Spark Connect server instead."""
    remote = remote or os.environ.get("SPARK_REMOTE")
    if remote:
        from sparkpoint.runtime.connect import connect_session

        return connect_session(remote, shuffle_partitions, extra_conf)
    check_java()
    # Everything binds to loopback: an embedded local run needs no network.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
    )
    for k, v in (extra_conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    from sparkpoint.runtime.connect import is_connect

    if not is_connect(spark):  # a Connect session logs on its server: nothing to quiet here
        spark.sparkContext.setLogLevel("ERROR")
        _quiet_task_failures(spark)
    return spark


def _quiet_task_failures(spark) -> None:
    """A task that fails makes Spark log its whole Java and Python trace (~45 lines) once
    per attempt. The job master reports every failure itself, in one line, with the full
    trace written to a file: Spark's copy would bury that line."""
    try:
        jvm = spark.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.OFF
        for name in ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager"):
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
    except Exception:  # another logging backend: Spark's messages stay as they are
        pass
