"""Query results compared as multisets of rows: the same columns in the same order, and
every row as often in one as in the other. Times compare as UTC milliseconds, whatever
unit or zone label each side's Arrow type carries; floats compare rounded to `digits`
places, explicitly; decimals compare by value."""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal

import pandas as pd


def _cell(value, digits: int):
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NaT:
        return None
    if isinstance(value, pd.Timestamp):
        stamp = value.tz_localize("UTC") if value.tzinfo is None else value.tz_convert("UTC")
        return ("time-ms", stamp.value // 1_000_000)
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, Decimal):
        return value.normalize()
    if hasattr(value, "item"):  # numpy scalars
        return _cell(value.item(), digits)
    return value


def row_counts(df: pd.DataFrame, digits: int = 9) -> Counter:
    return Counter(tuple(_cell(v, digits) for v in row) for row in df.itertuples(index=False, name=None))


def assert_same_rows(actual: pd.DataFrame, expected: pd.DataFrame, digits: int = 9) -> None:
    assert list(actual.columns) == list(expected.columns), \
        f"columns differ: got {list(actual.columns)}, expected {list(expected.columns)}"
    got, want = row_counts(actual, digits), row_counts(expected, digits)
    if got == want:
        return
    missing, extra = want - got, got - want
    raise AssertionError(
        f"{len(actual)} rows, expected {len(expected)}: {sum(missing.values())} expected rows missing, "
        f"{sum(extra.values())} unexpected; missing e.g. {list(missing.items())[:3]}; "
        f"unexpected e.g. {list(extra.items())[:3]}")
