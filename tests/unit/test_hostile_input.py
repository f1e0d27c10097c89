"""Input that other languages' JSON parsers, our database columns or the CLI's own parsing cannot
take is refused with one clear line, before anything is written (no database: the pure checks)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feedproc.core.errors import InvalidInput
from feedproc.core.models import MAX_DEPTH, encode_json, item_from_row, json_depth


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (float("nan"), "NaN or Infinity"),
        ({"x": [float("inf")]}, "NaN or Infinity"),
        ("\ud800", "lone surrogate"),
        ({"k\udfff": 1}, "lone surrogate"),
    ],
)
def test_data_other_languages_cannot_parse_is_invalid(data: object, problem: str) -> None:
    with pytest.raises(InvalidInput, match=problem):
        item_from_row({"gate": 0, "data": data}, where="item 1: ")


def test_data_may_nest_64_levels_not_65() -> None:
    nested: object = 1
    for _ in range(MAX_DEPTH):
        nested = [nested]
    assert json_depth(nested) == MAX_DEPTH
    assert encode_json(nested).count(b"[") == MAX_DEPTH
    with pytest.raises(InvalidInput, match="nests deeper than 64"):
        encode_json([nested])


def test_depth_is_measured_without_recursion() -> None:
    nested: object = []
    for _ in range(200_000):  # far past the interpreter's recursion limit
        nested = [nested]
    assert json_depth(nested) == MAX_DEPTH + 1  # it stops counting once past the limit


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_any_json_value_round_trips_as_standard_json(value: object) -> None:
    try:
        encoded = encode_json(value)
    except InvalidInput as error:  # only for a lone surrogate in a generated string
        assert "surrogate" in str(error)
        return
    assert json.loads(encoded.decode("utf-8")) == value
