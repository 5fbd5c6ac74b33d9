"""The user-facing API of keyed stateful steps."""

from sparkpoint.api.aggregate import KeyedAggregate
from sparkpoint.api.dedup import Deduplicate
from sparkpoint.api.join import IntervalJoin, StreamJoin, WindowJoin
from sparkpoint.api.processor import (ExpiredTimerInfo, ListState, MapState, ProcessorOperator, StatefulProcessor,
                                      StatefulProcessorHandle, TimerValues, ValueState)
from sparkpoint.api.topn import TopN
from sparkpoint.api.window import TumblingWindow
from sparkpoint.api.windows import CumulateWindow, SessionWindow, SlidingWindow

__all__ = [
    "KeyedAggregate", "TumblingWindow", "SlidingWindow", "SessionWindow", "CumulateWindow", "IntervalJoin",
    "WindowJoin", "StreamJoin", "ProcessorOperator", "StatefulProcessor", "StatefulProcessorHandle", "ValueState",
    "ListState", "MapState", "TimerValues", "ExpiredTimerInfo", "Deduplicate", "TopN",
]
