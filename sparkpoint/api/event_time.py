"""Event time as users write it: a Spark TIMESTAMP or TIMESTAMP_NTZ column, or epoch
milliseconds in an integer column.

Inside sparkpoint every event time is epoch ms (watermarks, window bounds and timers
in state), so a column is converted once, where it is read. A TIMESTAMP_NTZ value is
a wall-clock time: it is read as if it were UTC, whatever the session time zone, so
the same file gives the same windows everywhere. Output keeps the kind it came in
(`arrow_from_ms`): timestamps in, timestamps out.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa

from sparkpoint.errors import ConfigError

MS = "ms"                  # epoch milliseconds in an integer column
TIMESTAMP = "timestamp"    # Spark TIMESTAMP (an instant; Arrow timestamp with a zone)
TIMESTAMP_NTZ = "timestamp_ntz"  # Spark TIMESTAMP_NTZ (wall clock; Arrow timestamp without a zone)

_UTC = dt.timezone.utc


def _refuse(column: str, type_name: str, used_for: str) -> ConfigError:
    return ConfigError(
        f"{used_for}: event-time column {column!r} is {type_name}; event time must be a TIMESTAMP "
        f"(or TIMESTAMP_NTZ) column or epoch milliseconds as an integer (BIGINT). Convert it in a "
        f".transform() first, e.g. F.to_timestamp('{column}') for text, "
        f"F.timestamp_millis(F.col('{column}').cast('bigint')) or F.timestamp_seconds(...) for numbers")


def _missing(column: str, names: list[str], used_for: str) -> ConfigError:
    return ConfigError(f"{used_for}: event-time column {column!r} is not in the input (its columns: {names})")


def spark_kind(schema: Any, column: str, used_for: str) -> str:
    """The kind of a Spark StructType's event-time column, or one ConfigError."""
    from pyspark.sql.types import ByteType, IntegerType, LongType, ShortType, TimestampNTZType, TimestampType

    if column not in schema.names:
        raise _missing(column, list(schema.names), used_for)
    t = schema[column].dataType
    if isinstance(t, TimestampType):
        return TIMESTAMP
    if isinstance(t, TimestampNTZType):
        return TIMESTAMP_NTZ
    if isinstance(t, (ByteType, ShortType, IntegerType, LongType)):
        return MS
    raise _refuse(column, t.simpleString(), used_for)


def arrow_kind(schema: pa.Schema, column: str, used_for: str) -> str:
    """The kind of an Arrow schema's event-time column, or one ConfigError."""
    if column not in schema.names:
        raise _missing(column, list(schema.names), used_for)
    t = schema.field(column).type
    if pa.types.is_timestamp(t):
        return TIMESTAMP if t.tz is not None else TIMESTAMP_NTZ
    if pa.types.is_integer(t):
        return MS
    raise _refuse(column, str(t), used_for)


def spark_ms(df: Any, column: str, used_for: str):
    """`df[column]` as epoch ms (a Spark Column of BIGINT)."""
    from pyspark.sql import functions as F

    kind = spark_kind(df.schema, column, used_for)
    col = F.col(column)
    if kind == TIMESTAMP:
        return F.unix_millis(col)
    if kind == TIMESTAMP_NTZ:
        # unix_millis would first cast to TIMESTAMP in the session time zone; the
        # difference to the NTZ epoch is zone-free.
        return F.timestamp_diff("MILLISECOND", F.lit("1970-01-01 00:00:00").cast("timestamp_ntz"), col)
    return col.cast("bigint")


def arrow_ms(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Arrow event times (timestamp of any unit and zone, or integer ms) as int64 ms."""
    if pa.types.is_timestamp(values.type):
        # Arrow stores zoned timestamps as UTC and naive ones as wall clock, which is
        # exactly the NTZ-as-UTC reading above.
        return values.cast(pa.timestamp("ms", tz=values.type.tz), safe=False).cast(pa.int64())
    return values.cast(pa.int64())


def arrow_type(kind: str) -> pa.DataType:
    """The Arrow type event times of `kind` are output as (Spark's own for timestamps)."""
    if kind == TIMESTAMP:
        return pa.timestamp("us", tz="UTC")
    if kind == TIMESTAMP_NTZ:
        return pa.timestamp("us")
    return pa.int64()


def arrow_from_ms(ms: Any, kind: str) -> pa.Array:
    """Epoch ms back to the kind the user gave."""
    arr = pa.array(ms, type=pa.int64())
    if kind == MS:
        return arr
    t = arrow_type(kind)
    return arr.cast(pa.timestamp("ms", tz=t.tz)).cast(t)


def timer_ms(value: Any) -> int:
    """A timer's time as epoch ms: an integer (epoch ms, PySpark's unit), a pandas
    Timestamp, a datetime (naive means UTC, as in state) or a numpy datetime64."""
    if isinstance(value, (bool, np.bool_)) or value is None or type(value).__name__ == "NaTType":
        pass
    elif isinstance(value, (int, np.integer)):
        return int(value)
    elif isinstance(value, (float, np.floating)) and value == value:
        return int(value)
    elif isinstance(value, np.datetime64):
        if not np.isnat(value):
            return int(value.astype("datetime64[ms]").astype(np.int64))
    elif isinstance(value, dt.datetime):  # includes pandas.Timestamp
        aware = value if value.tzinfo is not None else value.replace(tzinfo=_UTC)
        return (aware - dt.datetime(1970, 1, 1, tzinfo=_UTC)) // dt.timedelta(milliseconds=1)
    raise ConfigError(f"a timer time must be epoch milliseconds (an integer) or a timestamp "
                      f"(pandas.Timestamp, datetime, numpy.datetime64); got {value!r}")
