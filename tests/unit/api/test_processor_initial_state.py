"""A processor's initial state (PySpark's `handleInitialState`): applied once per key,
in the first epoch and before that key's rows, never again after a restore."""

from __future__ import annotations

from decimal import Decimal
from typing import Iterator

import pandas as pd
import pytest

from sparkpoint import ProcessorOperator, StatefulProcessor
from sparkpoint.errors import ConfigError
from sparkpoint.testing import ProcessorTester

BALANCES = pd.DataFrame({"account": ["a", "b", "b"], "opening": [Decimal("10.00"), Decimal("5.50"), Decimal("1.25")],
                         "note": ["x", "y", "z"]})


class Balance(StatefulProcessor):
    """A running balance per account, opened from the initial state."""

    def init(self, handle) -> None:
        self.balance = handle.getValueState("balance", "amount DECIMAL(12, 2) NOT NULL, opened_with INT")

    def handleInitialState(self, key, initialState: pd.DataFrame, timerValues) -> None:
        self.balance.update((sum(initialState["opening"], Decimal(0)), len(initialState)))

    def handle_input_rows(self, key, rows: pd.DataFrame, timer_values) -> Iterator[pd.DataFrame]:
        old = self.balance.get()
        amount = (old[0] if old else Decimal(0)) + sum(rows["delta"], Decimal(0))
        self.balance.update((amount, old[1] if old else None))
        yield pd.DataFrame({"account": [key[0]], "balance": [str(amount)]})


def balances(initial=BALANCES) -> ProcessorOperator:
    return ProcessorOperator("balances", Balance, ["account"], "account STRING, balance STRING",
                             initial_state=initial)


def deltas(*pairs) -> pd.DataFrame:
    return pd.DataFrame({"account": [a for a, _ in pairs], "delta": [Decimal(d) for _, d in pairs]})


def test_the_initial_state_is_applied_once_per_key_before_the_first_rows() -> None:
    tester = ProcessorTester(balances())
    out = tester.process(deltas(("a", "1.00"), ("c", "2.00")))
    assert sorted(map(tuple, out.values.tolist())) == [("a", "11.00"), ("c", "2.00")]
    assert tester.peek_value_state("balance", "b") == (Decimal("6.75"), 2)  # grouped: both rows of b at once
    out = tester.process(deltas(("a", "1.00"), ("b", "-0.75")))
    assert sorted(map(tuple, out.values.tolist())) == [("a", "12.00"), ("b", "6.00")]


def test_a_restore_does_not_apply_the_initial_state_again() -> None:
    tester = ProcessorTester(balances())
    tester.process(deltas(("a", "-4.00")))
    restored = ProcessorTester.from_snapshot(balances(), tester.snapshot())
    out = restored.process(deltas(("a", "1.00")))
    assert out.to_dict("records") == [{"account": "a", "balance": "7.00"}]
    assert restored.peek_value_state("balance", "b") == (Decimal("6.75"), 2)


def test_an_initial_state_without_a_handler_or_its_key_columns_is_refused_in_one_line() -> None:
    class NoHandler(StatefulProcessor):
        def init(self, handle) -> None:
            self.v = handle.getValueState("v", "n INT")

        def handle_input_rows(self, key, rows, timer_values):
            return iter(())

    tester = ProcessorTester(ProcessorOperator("p", NoHandler, ["account"], "account STRING", initial_state=BALANCES))
    with pytest.raises(ConfigError, match="NoHandler is given an initial_state but defines no handle_initial_state"):
        tester.process(deltas(("a", "1")))
    with pytest.raises(ConfigError, match=r"initial_state lacks the key column\(s\) \['account'\]"):
        ProcessorOperator("p", Balance, ["account"], "account STRING", initial_state=BALANCES.drop(columns="account"))


def test_the_operator_ships_to_executors_without_its_initial_state() -> None:
    import pickle

    op = balances()
    assert pickle.loads(pickle.dumps(op)).initial_state is None
    assert op.initial_state is BALANCES
