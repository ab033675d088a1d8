"""Go-compatible JSON text: escaping, number formatting, indentation, order kept."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from istio_agent.gojson import dumps, go_number, go_string


@pytest.mark.parametrize(("text", "expected"), [
    ("plain", '"plain"'),
    ("a<b>&c", r'"a\u003cb\u003e\u0026c"'),
    ('q"\\', r'"q\"\\"'),
    ("\b\f\n\r\t", r'"\b\f\n\r\t"'),
    ("\x00\x01\x1f", r'"\u0000\u0001\u001f"'),
    ("\x7f", '"\x7f"'),
    ("é ü 中", '"é ü 中"'),
    ("\u2028\u2029", r'"\u2028\u2029"'),
    ("bad\udcff", r'"bad\ufffd"'),
])
def test_strings_escaped_as_go(text: str, expected: str) -> None:
    assert go_string(text) == expected


@pytest.mark.parametrize(("value", "expected"), [
    (0, "0"),
    (15021, "15021"),
    (-7, "-7"),
    (2.0, "2"),
    (1.5, "1.5"),
    (0.1, "0.1"),
    (1e-05, "0.00001"),
    (1e-06, "0.000001"),
    (1e-07, "1e-7"),
    (1.5e-07, "1.5e-7"),
    (1e-10, "1e-10"),
    (1e20, "100000000000000000000"),
    (1e21, "1e+21"),
    (1.5e300, "1.5e+300"),
    (-0.0, "-0"),
    (2**53 + 1, "9007199254740992"),  # Go holds JSON numbers as float64
])
def test_numbers_as_go_float64(value: float, expected: str) -> None:
    assert go_number(value) == expected


def test_nan_is_refused() -> None:
    with pytest.raises(ValueError):
        go_number(float("nan"))


def test_layout_matches_go_marshal_indent() -> None:
    value = {"b": [1, {"x": None}], "a": {}, "c": [], "d": True, "e": False}
    assert dumps(value) == (
        '{\n'
        '  "b": [\n'
        '    1,\n'
        '    {\n'
        '      "x": null\n'
        '    }\n'
        '  ],\n'
        '  "a": {},\n'
        '  "c": [],\n'
        '  "d": true,\n'
        '  "e": false\n'
        '}'
    )


def test_non_string_keys_and_unknown_types_are_refused() -> None:
    with pytest.raises(TypeError):
        dumps({1: "x"})
    with pytest.raises(TypeError):
        dumps({"x": object()})


_scalars = st.none() | st.booleans() | st.integers(-(2**52), 2**52) | st.text()
_json = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)


@given(_json)
def test_output_is_json_with_the_same_value(value: Any) -> None:
    text = dumps(value)  # hypothesis text() has no lone surrogates, so nothing is replaced
    assert json.loads(text) == value
    assert "<" not in text and ">" not in text and "&" not in text


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_float_text_parses_back_to_the_same_float(value: float) -> None:
    assert float(go_number(value)) == value
