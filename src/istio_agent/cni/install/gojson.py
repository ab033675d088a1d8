"""JSON text as Go's `encoding/json` writes it with `MarshalIndent(v, "", "  ")`.

Upstream writes every CNI config it touches this way, and other agents on a node
(and the conformance goldens) see those bytes, so we write the same ones:
map keys sorted (Go sorts `map[string]any`; a struct keeps its field order, so
`sort_keys=False` keeps the dict's order), `<`, `>`, `&`, U+2028 and U+2029
escaped, other non-ASCII written raw, and numbers as the float64 Go decoded them
into (`1.0` is `1`, `1e21` is `1e+21`, `1e-7` is `1e-07` cleaned to `1e-7`).
Pure functions.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f",
            "<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def go_string(text: str) -> str:
    out = ['"']
    for ch in text:
        escaped = _ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def go_number(value: int | float) -> str:
    """A JSON number as Go prints the float64 it decoded it into (strconv 'f', or 'e' outside [1e-6, 1e21))."""
    number = float(value)
    if math.isinf(number) or math.isnan(number):
        raise ValueError(f"unsupported value: {value!r}")
    if number == 0:
        return "-0" if math.copysign(1.0, number) < 0 else "0"
    _, digit_tuple, exponent = Decimal(repr(number)).as_tuple()  # repr: the shortest digits that round-trip
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple)).lstrip("0")
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    digits = stripped
    sign = "-" if number < 0 else ""
    if 1e-6 <= abs(number) < 1e21:
        if exponent >= 0:
            return sign + digits + "0" * exponent
        point = len(digits) + exponent
        if point > 0:
            return f"{sign}{digits[:point]}.{digits[point:]}"
        return f"{sign}0.{'0' * -point}{digits}"
    scientific = exponent + len(digits) - 1
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    if scientific < 0:
        return f"{sign}{mantissa}e-{-scientific}"  # Go's encoder cleans e-07 to e-7
    return f"{sign}{mantissa}e+{scientific:02d}"


def go_marshal_indent(value: Any, sort_keys: bool = True) -> str:
    """`json.MarshalIndent(value, "", "  ")` (no trailing newline)."""
    out: list[str] = []
    _encode(value, out, 0, sort_keys)
    return "".join(out)


def _encode(value: Any, out: list[str], depth: int, sort_keys: bool) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(go_string(value))
    elif isinstance(value, int | float):
        out.append(go_number(value))
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        keys = sorted(value) if sort_keys else list(value)
        inner = "\n" + "  " * (depth + 1)
        out.append("{")
        for index, key in enumerate(keys):
            out.append(("," if index else "") + inner + go_string(str(key)) + ": ")
            _encode(value[key], out, depth + 1, sort_keys)
        out.append("\n" + "  " * depth + "}")
    elif isinstance(value, list | tuple):
        if not value:
            out.append("[]")
            return
        inner = "\n" + "  " * (depth + 1)
        out.append("[")
        for index, item in enumerate(value):
            out.append(("," if index else "") + inner)
            _encode(item, out, depth + 1, sort_keys)
        out.append("\n" + "  " * depth + "]")
    else:
        raise TypeError(f"not JSON-serialisable: {type(value).__name__}")
