"""sparkpoint: fault-tolerant, exactly-once stateful stream processing for PySpark,
with Flink-grade checkpoint coordination."""

from typing import TYPE_CHECKING

from sparkpoint.spark_version import require_supported_pyspark

# PySpark is the `spark` extra or the cluster's own: a missing or unsupported one is one
# line at import rather than an obscure failure inside the first job.
require_supported_pyspark()

from sparkpoint.api import (  # noqa: E402
    CumulateWindow,
    Deduplicate,
    ExpiredTimerInfo,
    IntervalJoin,
    KeyedAggregate,
    ListState,
    MapState,
    ProcessorOperator,
    SessionWindow,
    SlidingWindow,
    StatefulProcessor,
    StatefulProcessorHandle,
    StreamJoin,
    TimerValues,
    TopN,
    TumblingWindow,
    ValueState,
    WindowJoin,
)
from sparkpoint.api import pipeline as _pipeline  # noqa: E402
from sparkpoint.api.pipeline import Pipeline, Stream  # noqa: E402
from sparkpoint.config import Settings  # noqa: E402
from sparkpoint.connectors.delta_sink import DeltaSink  # noqa: E402
from sparkpoint.connectors.files import FileSource  # noqa: E402
from sparkpoint.connectors.generator import GeneratorSource  # noqa: E402
from sparkpoint.connectors.parquet_sink import ParquetSink  # noqa: E402
from sparkpoint.job import run  # noqa: E402
from sparkpoint.runtime.state_reader import read_state, read_timers  # noqa: E402

if TYPE_CHECKING:  # loaded on first use (__getattr__ below); named here for type checkers and the API docs
    from sparkpoint.connectors.kafka_sink import KafkaSink
    from sparkpoint.connectors.kafka_source import KafkaSource

_pipeline.set_launcher(run)  # Pipeline.run -> sparkpoint.job.run (the builder does not import the runtime)

__version__ = "0.1.0"

# The Kafka connectors load on first use: their metrics register at import, and a
# pipeline without Kafka should not carry them.
_LAZY = {
    "KafkaSource": "sparkpoint.connectors.kafka_source",
    "KafkaSink": "sparkpoint.connectors.kafka_sink",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sparkpoint' has no attribute {name!r}")

__all__ = [
    "run", "Pipeline", "Stream", "Settings", "GeneratorSource", "FileSource", "ParquetSink", "DeltaSink",
    "KafkaSource", "KafkaSink", "KeyedAggregate", "IntervalJoin", "WindowJoin", "StreamJoin",
    "TumblingWindow", "SlidingWindow", "SessionWindow", "CumulateWindow", "Deduplicate", "TopN", "ProcessorOperator", "StatefulProcessor",
    "StatefulProcessorHandle", "ValueState", "ListState", "MapState", "TimerValues", "ExpiredTimerInfo", "read_state",
    "read_timers",
]
