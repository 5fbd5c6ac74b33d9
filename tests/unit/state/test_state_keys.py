from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from sparkpoint.state.keys import (decode_fixed_user_keys, decode_timestamp, encode_state_keys, encode_timestamp, encode_user_key,
                                   encode_user_keys, key_columns_from_plain, key_group_range, namespace,
                                   plain_key_tuples)


@pytest.mark.parametrize("parallelism, max_parallelism", [(1, 128), (3, 128), (4, 16), (7, 7), (5, 32768)])
def test_key_group_ranges_match_the_runtime_subtask_formula(parallelism: int, max_parallelism: int) -> None:
    owner = {kg: kg * parallelism // max_parallelism for kg in range(max_parallelism)}
    for subtask in range(parallelism):
        assert list(key_group_range(subtask, parallelism, max_parallelism)) == \
            [kg for kg, s in owner.items() if s == subtask]


def test_state_keys_start_with_the_key_group_then_namespace() -> None:
    rows = pa.table({"user": ["ann", "bob"], "__kg": [3, 300], "start": [10, -10]})
    keys = encode_state_keys(rows, ["user"], "__kg", namespace("win"), "start")
    assert keys[0].startswith(b"\x00\x03\x03win") and keys[1].startswith(b"\x01\x2c\x03win")
    assert keys[0].endswith(encode_timestamp(10)) and keys[1].endswith(encode_timestamp(-10))


def test_scalar_and_vectorized_user_keys_agree() -> None:
    rows = pa.table({"a": pa.array([1, None, -5], pa.int64()), "b": ["x", "yy", None],
                     "c": pa.array([1.0, -0.0, 2.5]), "d": [True, False, None]})
    vectorized = encode_user_keys(rows, ["a", "b", "c", "d"])
    types = [rows.schema.field(c).type for c in "abcd"]
    for i, row in enumerate(rows.to_pylist()):
        assert encode_user_key(tuple(row.values()), types) == vectorized[i]
    assert len(set(vectorized)) == 3


def test_user_keys_are_prefix_free_and_null_is_not_empty() -> None:
    keys = encode_user_keys(pa.table({"s": ["a", "ab", "", None]}), ["s"])
    assert len(set(keys)) == 4
    assert not any(x != y and y.startswith(x) for x in keys for y in keys)
    pairs = encode_user_keys(pa.table({"a": ["ab", "a"], "b": ["c", "bc"]}), ["a", "b"])
    assert pairs[0] != pairs[1]


def test_integer_keys_and_timestamps_sort_numerically() -> None:
    values = [-(2**63), -2, -1, 0, 1, 2**40, 2**63 - 1]
    keys = encode_user_keys(pa.table({"n": pa.array(values, pa.int64())}), ["n"])
    assert keys == sorted(keys)
    assert [decode_timestamp(encode_timestamp(v)) for v in values] == values
    assert sorted(encode_timestamp(v) for v in reversed(values)) == [encode_timestamp(v) for v in values]


def test_plain_key_tuples_round_trip_temporal_keys() -> None:
    at = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    rows = pa.table({"t": pa.array([at], pa.timestamp("us", tz="UTC")), "s": ["x"]})
    plain = plain_key_tuples(rows, ["t", "s"])
    assert plain == [(int(at.timestamp() * 1_000_000), "x")]
    back = key_columns_from_plain(plain, list(rows.schema))
    assert pa.table(back, names=["t", "s"]).equals(rows)


def test_integer_like_user_keys_decode_column_wise_to_what_was_encoded() -> None:
    table = pa.table({
        "i64": pa.array([-(1 << 63), -1, 0, None, (1 << 63) - 1], pa.int64()),
        "i16": pa.array([-5, 7, None, 0, 300], pa.int16()),
        "ts": pa.array([0, None, -86_400_000_000, 1_700_000_000_000_000, 1], pa.timestamp("us", "UTC")),
        "d": pa.array([dt.date(1970, 1, 1), dt.date(2026, 11, 24), None, dt.date(1900, 2, 28), dt.date(1, 1, 1)]),
        "b": pa.array([True, False, None, True, False]),
    })
    encoded = pa.array(encode_user_keys(table, table.column_names), pa.binary())
    assert decode_fixed_user_keys(encoded.slice(1), list(table.schema)) == \
        [c.combine_chunks() for c in table.slice(1).columns]
    assert decode_fixed_user_keys(encoded, [pa.field("k", pa.string())]) is None  # strings: one by one
