"""A snapshot records its processor's state schemas, and a restore into a processor
declared differently accepts compatible changes and refuses the others in one line,
as a job's restore does (tests/integration/test_state_schema_restore.py)."""

from __future__ import annotations

import dataclasses
from typing import Iterator

import pandas as pd
import pytest

from sparkpoint import ProcessorOperator, StatefulProcessor
from sparkpoint.errors import IncompatibleStateSchemaError
from sparkpoint.runtime.state_source import SCHEMA_KEY
from sparkpoint.testing import ProcessorTester


def counting(totals_schema: str, kind: str = "value"):
    class Counting(StatefulProcessor):
        def init(self, handle) -> None:
            get = handle.getValueState if kind == "value" else handle.getListState
            self.totals = get("totals", totals_schema)

        def handle_input_rows(self, key, rows: pd.DataFrame, timer_values) -> Iterator[pd.DataFrame]:
            old = self.totals.get() if kind == "value" else None
            n = (old[0] if old else 0) + len(rows)
            total = (old[1] if old else 0.0) + float(rows["amount"].sum())
            fields = totals_schema.count(",") + 1
            self.totals.update((n, total, *(["seen"] * (fields - 2))))
            yield pd.DataFrame({"user": [key[0]], "n": [n]})
    return ProcessorOperator("counting", Counting, ["user"], "user STRING, n BIGINT")


def orders(*pairs: tuple[str, float]) -> pd.DataFrame:
    return pd.DataFrame({"user": [u for u, _ in pairs], "amount": [a for _, a in pairs]})


def first_snapshot():
    tester = ProcessorTester(counting("n INT, total FLOAT"))
    tester.process(orders(("ann", 1.5), ("ann", 2.0), ("bob", 4.0)))
    return tester.snapshot()


def test_a_snapshot_records_the_declared_state_schemas() -> None:
    recorded = first_snapshot().lineage[SCHEMA_KEY]
    assert [s["name"] for s in recorded["states"]] == ["totals"] and recorded["operator"] == "counting"


def test_widened_numbers_and_an_appended_nullable_field_restore_and_old_rows_read_it_as_null() -> None:
    restored = ProcessorTester.from_snapshot(counting("n BIGINT, total DOUBLE, note STRING"), first_snapshot())
    assert restored.peek_value_state("totals", "ann") == (2, 3.5, None)
    restored.process(orders(("ann", 1.0)))
    assert restored.peek_value_state("totals", "ann") == (3, 4.5, "seen")
    assert restored.peek_value_state("totals", "bob") == (1, 4.0, None)
    assert sorted(restored.state()["user"]) == ["ann", "bob"]


@pytest.mark.parametrize("processor, message", [
    (counting("n INT"), "state 'totals', field 'total' is dropped"),
    (counting("n STRING, total FLOAT"), "state 'totals', field 'n' was INT and is declared STRING"),
    (counting("n INT, total FLOAT", kind="list"), "state 'totals' was a value state and is declared as a list state"),
])
def test_an_incompatible_change_stops_the_restore_in_one_line(processor, message: str) -> None:
    snapshot = first_snapshot()
    with pytest.raises(IncompatibleStateSchemaError, match=message) as e:
        ProcessorTester.from_snapshot(processor, snapshot)
    assert str(e.value).startswith("the snapshot: step 'counting', state 'totals'") and "\n" not in str(e.value)


def test_a_snapshot_that_records_no_schema_still_restores() -> None:
    """Taken before schemas were recorded: nothing to check against, restored as it was."""
    snapshot = first_snapshot()
    old = dataclasses.replace(snapshot, lineage={k: v for k, v in snapshot.lineage.items() if k != SCHEMA_KEY})
    restored = ProcessorTester.from_snapshot(counting("n INT, total FLOAT"), old)
    assert restored.peek_value_state("totals", "ann") == (2, 3.5)
