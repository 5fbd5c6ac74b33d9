"""Whether a processor's state, as a checkpoint recorded its schemas, can be read by the
processor as it is declared now. Pure: two `OperatorStateSchema`s in, one line out.

A stored row is a list of its fields in declaration order (sparkpoint.state.codec), so
what stays readable is what keeps every stored position meaning the same:

  accepted
    - nullable fields added after the last field (of a state's row, or of a STRUCT in
      it): rows written before read them as null;
    - a widened number: TINYINT < SMALLINT < INT < BIGINT, FLOAT < DOUBLE, a DECIMAL's
      precision grown at the same scale;
    - a NOT NULL field made nullable;
    - a new state, or a state no longer declared (its data stays in the checkpoint, unread);
    - a changed or removed TTL.
  refused (IncompatibleStateSchemaError, before anything runs)
    - a field dropped, renamed or moved; a field inserted before existing ones; a new
      field that is NOT NULL;
    - a field's type changed other than widened; a nullable field made NOT NULL;
    - a state whose kind changed (value, list, map) under the same name;
    - a map state's key schema changed other than widened (entries are found by the
      key's stored bytes).
"""

from __future__ import annotations

import pyarrow as pa

from sparkpoint.errors import IncompatibleStateSchemaError
from sparkpoint.state.ddl import ddl_of
from sparkpoint.state.descriptor import OperatorStateSchema, StateVariable

_INT_ORDER = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]


def check_compatible(recorded: OperatorStateSchema, declared: OperatorStateSchema, what: str) -> list[str]:
    """Raises IncompatibleStateSchemaError when `declared` cannot read state written
    under `recorded`; `what` names the checkpoint. Returns notes on the accepted
    changes (for the log)."""
    notes: list[str] = []
    if recorded.type != "processor" or declared.type != "processor":
        return notes
    now = {s.name: s for s in declared.states}
    for old in recorded.states:
        new = now.get(old.name)
        where = f"{what}: step {declared.operator!r}, state {old.name!r}"
        if new is None:
            notes.append(f"state {old.name!r} is no longer declared; its data stays in the checkpoint, unread")
            continue
        if new.kind != old.kind:
            raise IncompatibleStateSchemaError(
                f"{where} was a {old.kind} state and is declared as a {new.kind} state; its stored values cannot be "
                f"read as another kind: keep it a {old.kind} state, or give the {new.kind} state a new name (it "
                "starts empty and the old state stays unread)")
        notes += _check_fields(old.schema, new.schema, where, appendable=True)
        if old.kind == "map":
            notes += _check_fields(old.map_key_schema, new.map_key_schema, f"{where} (map key)", appendable=False)
    for name in sorted(set(now) - {s.name for s in recorded.states}):
        notes.append(f"state {name!r} is new; it starts empty")
    return notes


def _check_fields(old: pa.Schema | pa.StructType | None, new: pa.Schema | pa.StructType | None, where: str,
                  appendable: bool) -> list[str]:
    old_fields, new_fields = list(old or ()), list(new or ())
    notes = []
    for i, before in enumerate(old_fields):
        if i >= len(new_fields) or new_fields[i].name != before.name:
            now = new_fields[i].name if i < len(new_fields) else None
            change = ("is dropped" if before.name not in [f.name for f in new_fields] else
                      f"has moved (position {i + 1} is now {now!r})")
            raise IncompatibleStateSchemaError(
                f"{where}, field {before.name!r} {change}; stored rows hold their fields by position, so fields may "
                f"only be added after the last one: put {before.name!r} back where it was (unused is fine), or give "
                "the state a new name (it starts empty)")
        after = new_fields[i]
        _check_type(before.type, after.type, f"{where}, field {before.name!r}", appendable)
        if before.nullable and not after.nullable:
            raise IncompatibleStateSchemaError(
                f"{where}, field {before.name!r} is now NOT NULL but stored rows may hold nulls in it: keep it "
                "nullable, or give the state a new name (it starts empty)")
        if before.type != after.type:
            notes.append(f"{where}, field {before.name!r} widened from {ddl_of(before.type)} to {ddl_of(after.type)}")
    for added in new_fields[len(old_fields):]:
        if not appendable:
            raise IncompatibleStateSchemaError(
                f"{where}, field {added.name!r} is added; map entries are found by their key's stored bytes, so a "
                "map state's key cannot gain fields: keep the key schema, or give the state a new name (it starts "
                "empty)")
        if not added.nullable:
            raise IncompatibleStateSchemaError(
                f"{where}, field {added.name!r} is added as NOT NULL, but rows stored before have no value for it: "
                "declare it nullable, or give the state a new name (it starts empty)")
        notes.append(f"{where}, field {added.name!r} added (null in rows stored before)")
    return notes


def _check_type(old: pa.DataType, new: pa.DataType, where: str, appendable: bool) -> None:
    """`appendable`: whether structs in it may gain fields (not inside a map state's key)."""
    if old == new or _widens(old, new):
        return
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        _check_fields(old, new, where, appendable)
        return
    if _is_list(old) and _is_list(new):
        _check_type(old.value_type, new.value_type, f"{where} (element)", appendable)
        return
    if pa.types.is_map(old) and pa.types.is_map(new):
        _check_type(old.key_type, new.key_type, f"{where} (map key)", appendable)
        _check_type(old.item_type, new.item_type, f"{where} (map value)", appendable)
        return
    raise IncompatibleStateSchemaError(
        f"{where} was {ddl_of(old)} and is declared {ddl_of(new)}; stored values cannot be read as that type (a "
        "type may only widen: TINYINT to SMALLINT to INT to BIGINT, FLOAT to DOUBLE, a DECIMAL's precision at the "
        "same scale): keep its type, or give the state a new name (it starts empty)")


def _widens(old: pa.DataType, new: pa.DataType) -> bool:
    if old in _INT_ORDER and new in _INT_ORDER:
        return _INT_ORDER.index(new) >= _INT_ORDER.index(old)
    if pa.types.is_floating(old) and pa.types.is_floating(new):
        return new.bit_width >= old.bit_width
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return new.scale == old.scale and new.precision >= old.precision
    return False


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


__all__ = ["check_compatible", "StateVariable"]
