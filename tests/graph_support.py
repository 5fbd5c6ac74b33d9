"""A tiny two-input step for graph tests: a regular inner join on one key, without TTL,
written to the contract the runtime runs two-input operators by (`input_arity == 2`,
`requires_event_time`, `prepare_input(left, right)` -> one keyed DataFrame)."""

from __future__ import annotations

import pandas as pd

from sparkpoint.api.processor import ProcessorOperator, StatefulProcessor

SIDE = "_side"


class _MatchOnce(StatefulProcessor):
    """Keeps each side's row of a key; emits the pair once both have arrived (keys are
    unique on each side, as order ids are)."""

    def __init__(self, left_cols: list[str], right_cols: list[str]):
        self.left_cols, self.right_cols = left_cols, right_cols

    def init(self, handle) -> None:
        self.left = handle.getValueState("left", ", ".join(f"{c} STRING" for c in self.left_cols))
        self.right = handle.getValueState("right", ", ".join(f"{c} STRING" for c in self.right_cols))

    def handle_input_rows(self, key, rows: pd.DataFrame, timer_values):
        for _, row in rows.iterrows():
            if row[SIDE] == "L":
                self.left.update(tuple(str(row[c]) for c in self.left_cols))
            else:
                self.right.update(tuple(str(row[c]) for c in self.right_cols))
        if self.left.exists() and self.right.exists():
            left, right = self.left.get(), self.right.get()
            self.left.clear()
            self.right.clear()
            yield pd.DataFrame([{"key": key[0], **dict(zip(self.left_cols, left)),
                                 **dict(zip(self.right_cols, right))}])


class InnerJoin(ProcessorOperator):
    """left.join(right, InnerJoin("matched", "order_id", ["customer", "amount"], ["method"]))."""

    input_arity = 2

    def __init__(self, name: str, key: str, left_cols: list[str], right_cols: list[str],
                 requires_event_time: bool = False):
        self.requires_event_time = requires_event_time
        self.left_cols, self.right_cols, self.key = list(left_cols), list(right_cols), key
        schema = ", ".join([f"key STRING"] + [f"{c} STRING" for c in left_cols + right_cols])
        super().__init__(name, lambda: _MatchOnce(self.left_cols, self.right_cols), ["key"], schema)

    def prepare_input(self, left, right):
        from pyspark.sql import functions as F

        cols = self.left_cols + self.right_cols

        def side(df, tag, own):
            return df.select(F.col(self.key).cast("string").alias("key"), F.lit(tag).alias(SIDE),
                             *[(F.col(c) if c in own else F.lit(None)).cast("string").alias(c) for c in cols])

        return side(left, "L", self.left_cols).unionByName(side(right, "R", self.right_cols))
