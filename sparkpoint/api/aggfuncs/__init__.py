"""Aggregates written as Spark SQL, several at once, for KeyedAggregate and the windows."""

from sparkpoint.api.aggfuncs.engine import BUFFERED, AggregateSet
from sparkpoint.api.aggfuncs.spec import AggCall, parse_agg

__all__ = ["AggregateSet", "AggCall", "parse_agg", "BUFFERED"]
