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
from sparkpoint.api import pipeline as _pipeline
from sparkpoint.api.pipeline import Pipeline
from sparkpoint.config import Settings
from sparkpoint.connectors.delta_sink import DeltaSink
from sparkpoint.connectors.files import FileSource
from sparkpoint.connectors.generator import GeneratorSource
from sparkpoint.connectors.parquet_sink import ParquetSink
from sparkpoint.job import run
from sparkpoint.runtime.state_reader import read_state, read_timers

_pipeline.set_launcher(run)  # Pipeline.run -> sparkpoint.job.run (the builder does not import the runtime)

__version__ = "0.1.0"

__all__ = [
    "run", "Pipeline", "Settings", "GeneratorSource", "FileSource", "ParquetSink", "DeltaSink", "KeyedAggregate",
    "TumblingWindow", "ProcessorOperator", "StatefulProcessor", "StatefulProcessorHandle", "ValueState", "ListState",
    "MapState", "TimerValues", "ExpiredTimerInfo", "read_state", "read_timers",
]
