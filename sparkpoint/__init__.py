"""sparkpoint: fault-tolerant, exactly-once stateful stream processing for PySpark,
with Flink-grade checkpoint coordination."""

from sparkpoint.api import (
    ExpiredTimerInfo,
    KeyedAggregate,
    ListState,
    MapState,
    ProcessorOperator,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
    TumblingWindow,
    ValueState,
)
from sparkpoint.api.pipeline import Pipeline
from sparkpoint.config import Settings
from sparkpoint.connectors.files import FileSource
from sparkpoint.connectors.generator import GeneratorSource
from sparkpoint.connectors.parquet_sink import ParquetSink

__version__ = "0.1.0"

__all__ = [
    "Pipeline", "Settings", "GeneratorSource", "FileSource", "ParquetSink", "KeyedAggregate", "TumblingWindow",
    "ProcessorOperator", "StatefulProcessor", "StatefulProcessorHandle", "ValueState", "ListState", "MapState",
    "TimerValues", "ExpiredTimerInfo",
]
