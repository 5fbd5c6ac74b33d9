"""Which changes of a processor's declared state a restore accepts (sparkpoint.state.evolution)."""

from __future__ import annotations

import pytest

from sparkpoint.errors import IncompatibleStateSchemaError
from sparkpoint.state.codec import parse_schema
from sparkpoint.state.descriptor import OperatorStateSchema, StateVariable
from sparkpoint.state.evolution import check_compatible

WHAT = "checkpoint 7"


def processor(*states: tuple) -> OperatorStateSchema:
    """States as (name, kind, value DDL[, map key DDL])."""
    return OperatorStateSchema("orders", "processor", ("customer",), states=tuple(
        StateVariable(s[0], s[1], parse_schema(s[2]), parse_schema(s[3]) if len(s) > 3 else None) for s in states))


BEFORE = processor(("totals", "value", "n INT, amount FLOAT, price DECIMAL(10, 2), "
                                       "address STRUCT<street: STRING>, tags ARRAY<STRUCT<t: STRING>>"),
                   ("seen", "map", "at BIGINT", "sku INT"))


@pytest.mark.parametrize("after", [
    pytest.param(processor(("totals", "value", "n INT, amount FLOAT, price DECIMAL(10, 2), "
                                               "address STRUCT<street: STRING>, tags ARRAY<STRUCT<t: STRING>>, "
                                               "note STRING"),
                           ("seen", "map", "at BIGINT", "sku INT")), id="a nullable field added at the end"),
    pytest.param(processor(("totals", "value", "n BIGINT, amount DOUBLE, price DECIMAL(12, 2), "
                                               "address STRUCT<street: STRING>, tags ARRAY<STRUCT<t: STRING>>"),
                           ("seen", "map", "at BIGINT", "sku BIGINT")), id="widened numbers"),
    pytest.param(processor(("totals", "value", "n INT, amount FLOAT, price DECIMAL(10, 2), "
                                               "address STRUCT<street: STRING, zip: INT>, "
                                               "tags ARRAY<STRUCT<t: STRING, w: DOUBLE>>"),
                           ("seen", "map", "at BIGINT", "sku INT")), id="nullable fields added to structs"),
    pytest.param(processor(("totals", "value", "n INT, amount FLOAT, price DECIMAL(10, 2), "
                                               "address STRUCT<street: STRING>, tags ARRAY<STRUCT<t: STRING>>"),
                           ("new", "list", "x INT")), id="a state dropped and one added"),
])
def test_compatible_changes_are_accepted_with_a_note(after: OperatorStateSchema) -> None:
    assert check_compatible(BEFORE, after, WHAT)


@pytest.mark.parametrize("after, message", [
    (processor(("totals", "value", "n INT, price DECIMAL(10, 2), address STRUCT<street: STRING>, "
                                   "tags ARRAY<STRUCT<t: STRING>>")),
     "state 'totals', field 'amount' is dropped"),
    (processor(("totals", "value", "n STRING, amount FLOAT, price DECIMAL(10, 2), address STRUCT<street: STRING>, "
                                   "tags ARRAY<STRUCT<t: STRING>>")),
     "state 'totals', field 'n' was INT and is declared STRING"),
    (processor(("totals", "value", "n SMALLINT, amount FLOAT, price DECIMAL(10, 2), "
                                   "address STRUCT<street: STRING>, tags ARRAY<STRUCT<t: STRING>>")),
     "field 'n' was INT and is declared SMALLINT"),
    (processor(("totals", "value", "n INT, amount FLOAT, price DECIMAL(10, 3), address STRUCT<street: STRING>, "
                                   "tags ARRAY<STRUCT<t: STRING>>")),
     "field 'price' was DECIMAL\\(10, 2\\) and is declared DECIMAL\\(10, 3\\)"),
    (processor(("totals", "value", "first STRING, n INT, amount FLOAT, price DECIMAL(10, 2), "
                                   "address STRUCT<street: STRING>, tags ARRAY<STRUCT<t: STRING>>")),
     "field 'n' has moved"),
    (processor(("totals", "value", "n INT, amount FLOAT, price DECIMAL(10, 2), address STRUCT<road: STRING>, "
                                   "tags ARRAY<STRUCT<t: STRING>>")),
     "field 'address', field 'street' is dropped"),
    (processor(("totals", "value", "n INT, amount FLOAT, price DECIMAL(10, 2), address STRUCT<street: STRING>, "
                                   "tags ARRAY<STRUCT<t: STRING>>, must INT NOT NULL")),
     "field 'must' is added as NOT NULL"),
    (processor(("totals", "value", "n INT NOT NULL, amount FLOAT, price DECIMAL(10, 2), "
                                   "address STRUCT<street: STRING>, tags ARRAY<STRUCT<t: STRING>>")),
     "field 'n' is now NOT NULL"),
    (processor(("totals", "list", "n INT")),
     "state 'totals' was a value state and is declared as a list state"),
    (processor(("seen", "map", "at BIGINT", "sku INT, shop STRING")),
     "state 'seen' \\(map key\\), field 'shop' is added"),
])
def test_an_incompatible_change_is_one_line_naming_step_state_field_and_what_to_do(after, message: str) -> None:
    with pytest.raises(IncompatibleStateSchemaError, match=message) as e:
        check_compatible(BEFORE, after, WHAT)
    text = str(e.value)
    assert text.startswith("checkpoint 7: step 'orders', state ") and "\n" not in text
    assert "give the state a new name" in text or "keep it a value state" in text
