"""The user-facing API of keyed stateful steps."""

from sparkpoint.api.aggregate import KeyedAggregate
from sparkpoint.api.join import IntervalJoin, StreamJoin, WindowJoin
from sparkpoint.api.processor import (ExpiredTimerInfo, ListState, MapState, ProcessorOperator, StatefulProcessor,
                                      StatefulProcessorHandle, TimerValues, ValueState)
from sparkpoint.api.window import TumblingWindow

__all__ = [
    "KeyedAggregate", "TumblingWindow", "IntervalJoin", "WindowJoin", "StreamJoin", "ProcessorOperator", "StatefulProcessor", "StatefulProcessorHandle",
    "ValueState", "ListState", "MapState", "TimerValues", "ExpiredTimerInfo",
]
