"""Spark schema -> the Arrow schema PySpark's Arrow batches (mapInArrow, toArrow) carry.

PySpark 4.0's `to_arrow_schema` labels TIMESTAMP columns UTC (`timestamp_utc=True`),
which is also how its workers label the batches; later 4.x take the session time zone
(`timezone=`) and label batches with it. Asking the running pyspark which it is keeps
one code path for every supported version."""

from __future__ import annotations

import functools
import inspect
from typing import Any


@functools.cache
def _takes_time_zone() -> bool:
    from pyspark.sql.pandas.types import to_arrow_schema

    return "timezone" in inspect.signature(to_arrow_schema).parameters


def arrow_schema(spark_schema: Any, time_zone: str) -> Any:
    """The Arrow schema of `spark_schema` as this pyspark's Arrow batches carry it;
    `time_zone` is the session's, used where this pyspark labels timestamps with it."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if _takes_time_zone():
        return to_arrow_schema(spark_schema, timezone=time_zone)
    return to_arrow_schema(spark_schema)
