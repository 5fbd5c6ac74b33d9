"""What the Kafka source and sink share: split ids, client configuration, the record
schema, decode helpers, and a log line that cannot storm.

A split is one topic partition, named "topic:partition". Its position is the next
offset to read (Kafka's own convention for committed offsets), so a restored
position is read from, never skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import pyarrow as pa

from sparkpoint.errors import ConfigError, KafkaConnectorError

REPO_ROOT = Path(__file__).resolve().parents[2]
SPARK_CONNECTOR_DIR = REPO_ROOT / ".cache" / "kafka" / "spark-connector"

# DDL of the records a KafkaSource returns. Timestamps are epoch milliseconds, as Kafka
# stores them, so nothing depends on the session time zone.
RECORD_SCHEMA_DDL = ("key binary, value binary, topic string, partition int, "
                     "offset bigint, timestamp bigint")
RECORD_ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.int64()),
])

# Keys the connectors set themselves; a user's client_config may not override them
# because exactly-once depends on their values.
_RESERVED_CONSUMER_KEYS = frozenset({"enable.auto.commit", "enable.auto.offset.store",
                                     "isolation.level", "enable.partition.eof"})
_RESERVED_PRODUCER_KEYS = frozenset({"transactional.id", "enable.idempotence"})


class KafkaDataLossError(KafkaConnectorError, ConfigError):
    """Records a checkpointed position expects are gone (removed by retention, or the
    topic was recreated or its log truncated) and `fail_on_data_loss=True`. Not retried
    (a ConfigError): the positions are in the checkpoint, so a restart meets the same
    gap. The message says which partition, which offsets, and how to go on."""


def split_id(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def parse_split(split: str) -> tuple[str, int]:
    """Inverse of `split_id`. Topic names may not contain ':', so the last ':' splits."""
    topic, _, partition = split.rpartition(":")
    if not topic or not partition.isdigit():
        raise ConfigError(f"not a Kafka split id: {split!r}; expected 'topic:partition'")
    return topic, int(partition)


def consumer_config(bootstrap_servers: str, client_config: Mapping[str, Any] | None,
                    **fixed: Any) -> dict[str, Any]:
    """The user's settings (security, timeouts, ...) passed through, then the
    connector's fixed ones. Refuses user values for keys exactly-once depends on."""
    return _merge(bootstrap_servers, client_config, _RESERVED_CONSUMER_KEYS, fixed)


def producer_config(bootstrap_servers: str, client_config: Mapping[str, Any] | None,
                    **fixed: Any) -> dict[str, Any]:
    return _merge(bootstrap_servers, client_config, _RESERVED_PRODUCER_KEYS, fixed)


def _merge(bootstrap_servers: str, client_config: Mapping[str, Any] | None,
           reserved: frozenset[str], fixed: Mapping[str, Any]) -> dict[str, Any]:
    user = dict(client_config or {})
    clashes = sorted(k for k in user if k in reserved)
    if clashes:
        raise ConfigError(f"client_config may not set {clashes}: the Kafka connector sets "
                          "them itself because exactly-once depends on them; remove them")
    # librdkafka logs every failed reconnect (several lines a second per client while a
    # broker is down) straight to stderr; through Python logging they are rate limited.
    merged: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "logger": LIBRDKAFKA_LOG, **user}
    merged.update({k.replace("_", "."): v for k, v in fixed.items()})
    return merged


def spark_connector_jars() -> list[str]:
    """Jars of Spark's own Kafka connector (fetched by `scripts/fetch_kafka.sh
    --spark-connector`), for `spark.jars` when using `reader="spark"`."""
    if not (SPARK_CONNECTOR_DIR / ".complete").exists():
        raise ConfigError(f"Spark's Kafka connector jars are not in {SPARK_CONNECTOR_DIR}: run "
                          "scripts/fetch_kafka.sh --spark-connector, or use reader='confluent'")
    return sorted(str(p) for p in SPARK_CONNECTOR_DIR.glob("*.jar"))


def add_spark_connector(spark: Any) -> None:
    """Make Spark's Kafka connector usable in a running session (ADD JAR reaches the
    driver's data source lookup and the executors), for when the session was created
    without the jars in `spark.jars`."""
    for jar in spark_connector_jars():
        spark.sql(f"ADD JAR '{jar}'")


# -- decode helpers ---------------------------------------------------------------------
def decode_utf8(df: Any, *columns: str) -> Any:
    """`df` with the binary `columns` (default: key and value) cast to UTF-8 strings."""
    from pyspark.sql import functions as F

    for name in columns or ("key", "value"):
        df = df.withColumn(name, F.col(name).cast("string"))
    return df


def decode_json(df: Any, schema: str, column: str = "value", into: str = "data") -> Any:
    """`df` with `column` parsed as JSON of the DDL `schema` into the struct column
    `into`; records that are not valid JSON give nulls, never a failed epoch."""
    from pyspark.sql import functions as F

    return df.withColumn(into, F.from_json(F.col(column).cast("string"), schema))


# -- logging without alarm storms ----------------------------------------------------------
class _OncePerInterval(logging.Filter):
    """Lets one record per (client facility, level) through every `interval_s`."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[tuple, float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        key = (record.levelno, args[1] if len(args) > 1 else record.msg)
        with self._lock:
            now = self._clock()
            last = self._last.get(key)
            if last is not None and now - last < self._interval_s:
                return False
            self._last[key] = now
        return True


LIBRDKAFKA_LOG = logging.getLogger("sparkpoint.kafka.librdkafka")
LIBRDKAFKA_LOG.addFilter(_OncePerInterval(30.0))


class RateLimitedLog:
    """Logs at most once per `interval_s`; the next line that gets through says how
    many were suppressed. A broker outage then costs one line per interval, not one
    per retry (seed 003: offset-commit warnings in a loop)."""

    def __init__(self, logger: logging.Logger, interval_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self._suppressed = 0
        self._lock = threading.Lock()

    def warning(self, msg: str, *args: Any) -> bool:
        """Returns True if the line was written."""
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last < self._interval_s:
                self._suppressed += 1
                return False
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        if suppressed:
            msg += f" ({suppressed} similar messages suppressed)"
        self._logger.warning(msg, *args)
        return True
