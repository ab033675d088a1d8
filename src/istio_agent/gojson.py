"""JSON text as Go's `json.MarshalIndent(v, "", "  ")` writes it.

Upstream writes the gRPC bootstrap and every CNI config it touches with Go's
encoder, and gRPC libraries, other CNI agents on a node, the conformance
goldens and humans diff those files, so the bytes matter, not only the values.
One plain library for both (the agent's `grpcxds/` and the CNI's `install/`).
Python's `json.dumps(indent=2)` differs in three ways this module fixes:

- strings: Go escapes `<`, `>`, `&` (HTML safety), U+2028/U+2029, and turns
  bytes that are not UTF-8 (surrogate escapes here) into `\\ufffd`; other
  non-ASCII stays raw UTF-8 as with `ensure_ascii=False`;
- numbers: Go holds every JSON number as a float64 and prints it without
  exponent in [1e-6, 1e21) (`2.0` -> `2`, `1e-05` -> `0.00001`) and with a
  one-digit negative exponent outside (`1e-07` -> `1e-7`);
- key order: Go structs keep declaration order and maps sort, so the
  caller either orders each dict (`sort_keys=False`, the default) or asks
  for every object's keys sorted, as for a `map[string]any` (`sort_keys=True`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

INDENT = "  "

_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_HTML_AND_SEPARATORS = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def go_string(text: str) -> str:
    """A quoted JSON string escaped exactly as Go's encoding/json (HTML escaping on) does."""
    out = ['"']
    for char in text:
        escaped = _SHORT_ESCAPES.get(char) or _HTML_AND_SEPARATORS.get(char)
        if escaped is not None:
            out.append(escaped)
        elif char < " ":
            out.append(f"\\u{ord(char):04x}")
        elif "\ud800" <= char <= "\udfff":
            out.append("\\ufffd")  # an undecodable byte (surrogateescape) becomes U+FFFD, as in Go
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def go_number(value: int | float) -> str:
    """A number as Go prints a float64: fixed notation in [1e-6, 1e21), else exponent."""
    if type(value) is int and -(2**53) <= value <= 2**53:  # exact as a float64, and printed as its digits
        return str(value)
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        raise ValueError(f"JSON cannot hold the number {value!r}")
    magnitude = abs(number)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        text = repr(number)  # shortest round-trip digits, exponent form in this range
        mantissa, _, exponent = text.partition("e")
        sign, digits = exponent[0], exponent[1:].lstrip("0") or "0"
        if sign == "+" and len(digits) < 2:
            digits = digits.rjust(2, "0")
        return f"{mantissa}e{sign}{digits}"
    from decimal import Decimal  # here: ~0.3 MB that the agents' files (ports, counts: integers) never need

    fixed = format(Decimal(repr(number)), "f")
    if "." in fixed:
        fixed = fixed.rstrip("0").rstrip(".")
    return fixed


def dumps(value: Any, sort_keys: bool = False) -> str:
    """`value` (dicts, lists, str, int, float, bool, None) as indented Go-style JSON, no trailing newline."""
    out: list[str] = []
    _encode(value, 0, out, sort_keys)
    return "".join(out)


def _encode(value: Any, level: int, out: list[str], sort_keys: bool) -> None:
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
    elif isinstance(value, Mapping):
        if not value:
            out.append("{}")
            return
        inner = "\n" + INDENT * (level + 1)
        out.append("{")
        items = sorted(value.items()) if sort_keys else value.items()
        for index, (key, item) in enumerate(items):
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys must be strings, not {type(key).__name__}")
            out.append(("," if index else "") + inner + go_string(key) + ": ")
            _encode(item, level + 1, out, sort_keys)
        out.append("\n" + INDENT * level + "}")
    elif isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        if not value:
            out.append("[]")
            return
        inner = "\n" + INDENT * (level + 1)
        out.append("[")
        for index, item in enumerate(value):
            out.append(("," if index else "") + inner)
            _encode(item, level + 1, out, sort_keys)
        out.append("\n" + INDENT * level + "]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON")
