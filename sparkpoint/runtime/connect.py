"""Jobs whose session is a Spark Connect client (`sc://host:port`).

Over Connect the driver sparkpoint runs in holds no JVM and no SparkContext: everything
goes through the DataFrame API, which the server plans and runs. What differs from a
classic session lives here: building a remote session, the observed metrics of an epoch
(the two kinds of session have two kinds of `Observation`), and the checks that turn a
server that cannot run the job into one line at start instead of a failing first epoch.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from sparkpoint.errors import ConfigError
from sparkpoint.redaction import mask_url

log = logging.getLogger(__name__)

# Settings a Connect client may change on its session: Spark SQL's runtime settings. The
# rest configures the server's JVM (memory, executors, jars) and is fixed when it starts.
_SESSION_CONF_PREFIX = "spark.sql."


def is_connect(spark_or_frame: Any) -> bool:
    """True for a Spark Connect session or DataFrame. Decided by the object, not by
    `pyspark.sql.utils.is_remote()` (a process-wide flag), so a classic session in a
    process that also opened a remote one is still treated as classic."""
    return type(spark_or_frame).__module__.startswith("pyspark.sql.connect.")


def connect_session(remote: str, shuffle_partitions: int, extra_conf: Mapping[str, str] | None = None):
    """A session on the Spark Connect server at `remote` (`sc://host:port[/;param=value]`).
    Only session settings are applied: shuffle partitions = parallelism, UTC, adaptive
    execution off (as for the sessions sparkpoint creates itself), then `spark.conf`.
    Keys Spark Connect cannot set from a client are named in one warning."""
    if not remote.startswith("sc://"):
        raise ConfigError(f"spark.remote={mask_url(remote)!r} is not a Spark Connect URL; use sc://HOST:PORT "
                          "(e.g. sc://127.0.0.1:15002)")
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
    except ImportError as e:
        raise ConfigError(f"spark.remote={mask_url(remote)} needs the Spark Connect client, which is not installed "
                          f"({e}); install it with `pip install 'pyspark[connect]'` "
                          "(grpcio, grpcio-status, googleapis-common-protos, zstandard)") from None
    from pyspark.sql import SparkSession

    conf = {
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        **{k: str(v) for k, v in (extra_conf or {}).items()},
    }
    ignored = sorted(k for k in conf if not k.startswith(_SESSION_CONF_PREFIX))
    if ignored:
        log.warning("spark.conf keys %s are not set: a Spark Connect client can only change spark.sql.* "
                    "settings of its session; pass the others to the server when it starts "
                    "(start-connect-server.sh --conf KEY=VALUE)", ", ".join(ignored))
    spark = SparkSession.builder.remote(remote).getOrCreate()
    for key, value in conf.items():
        if key not in ignored:
            spark.conf.set(key, value)
    return spark


def check_server_runs_sparkpoint(spark) -> None:
    """The server's Python workers run the job's steps: they must import sparkpoint, the
    same version as here. One small Spark job asks them."""
    import importlib
    import sys

    import pyarrow as pa

    def version(batches):
        for _ in batches:
            pass
        try:
            found = getattr(importlib.import_module("sparkpoint"), "__version__", "unknown")
        except ImportError as e:
            found = f"missing: {e}"
        yield pa.RecordBatch.from_pylist([{"version": found}], schema=pa.schema([("version", pa.string())]))

    try:
        row = spark.range(0, 1, 1, 1).mapInArrow(version, "version string").collect()[0]
    except Exception as e:  # noqa: BLE001 - the server's own error, in one line
        raise ConfigError(f"the Spark Connect server could not run a Python step ({_first_line(e)}); "
                          "its Python workers need pyarrow and sparkpoint installed") from None
    # The package root (loaded: this module is part of it) is read, not imported: it
    # installs the job launcher, a layer above the runtime.
    found, here = row["version"], getattr(sys.modules["sparkpoint"], "__version__", "unknown")
    if found.startswith("missing"):
        raise ConfigError(f"the Spark Connect server's Python workers cannot import sparkpoint ({found[9:]}): "
                          f"install sparkpoint=={here} in the server's Python environment (PYSPARK_PYTHON of "
                          "the server), or add it to PYTHONPATH when starting the server")
    if found != here:
        log.warning("the Spark Connect server's Python workers run sparkpoint %s, this driver %s: "
                    "install the same version on both", found, here)


def observe(df, name: str, *metrics):
    """`df.observe(...)` with an Observation of the DataFrame's kind. Returns the observed
    DataFrame and the observation; read it with `observed`."""
    if is_connect(df):
        from pyspark.sql.connect.observation import Observation as ConnectObservation

        obs = ConnectObservation(name)
    else:
        from pyspark.sql.observation import Observation

        # Observation() hands out the Connect kind once any remote session set pyspark's
        # process-wide flag; a classic DataFrame needs the classic kind.
        obs = object.__new__(Observation)
        obs.__init__(name)
    return df.observe(obs, *metrics), obs


def observed(obs) -> dict[str, Any] | None:
    """The observed metrics, or None when no action ran over the observed rows (a step
    that left them out of the plan). Never blocks: a classic Observation's `get` would
    wait forever for an action that never comes."""
    if hasattr(obs, "_jo"):  # classic: the JVM side's future tells whether the metrics came
        if obs._jo is None or not obs._jo.future().isCompleted():
            return None
        return obs.get
    metrics = obs.get  # Connect: filled in from the response of the action that ran it
    return metrics or None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
