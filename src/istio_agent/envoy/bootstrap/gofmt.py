"""Go's ways of writing values, for custom bootstrap templates and their parameters.

A Go template prints values with `fmt` (`true`, `[a b]`, `map[k:v]`, `<no value>` for a
missing key), pastes JSON that `encoding/json` wrote (sorted keys, `<>&` escaped, floats
without `.0`) and durations as `time.Duration` prints them (`1m30s`). Pure functions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any


class TemplateError(ValueError):
    """A template that does not parse or cannot be executed; the message names the line."""


NO_VALUE = "<no value>"


# ---------------------------------------------------------------------------------- values
def go_float(value: float) -> str:
    """A float64 as Go's encoding/json writes it: shortest digits, no `.0`, exponent only outside 1e-6..1e21."""
    if value != value or value in (float("inf"), float("-inf")):
        raise TemplateError(f"json: unsupported value: {value!r}")
    if value == 0:
        return "0"
    if 1e-6 <= abs(value) < 1e21:
        text = format(Decimal(repr(value)), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, _, exponent = repr(value).partition("e")
    digits = exponent[1:].lstrip("0")
    # strconv writes at least two exponent digits; encoding/json then trims e-07 to e-7.
    return f"{mantissa.removesuffix('.0')}e{exponent[0]}{digits if exponent[0] == '-' else digits.rjust(2, '0')}"


def _go_json_parts(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(go_float(value))
    elif isinstance(value, Mapping):
        out.append("{")
        for index, key in enumerate(sorted(value, key=str)):
            out.append("," if index else "")
            _go_json_parts(str(key), out)
            out.append(":")
            _go_json_parts(value[key], out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for index, item in enumerate(value):
            out.append("," if index else "")
            _go_json_parts(item, out)
        out.append("]")
    else:
        text = json.dumps(value if isinstance(value, str) else str(value), ensure_ascii=False)
        out.append(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
                   .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def go_json(value: Any) -> str:
    """Go's json.Marshal: compact, map keys sorted, `<>&` escaped for HTML safety, floats as Go prints them."""
    out: list[str] = []
    _go_json_parts(value, out)
    return "".join(out)


def go_duration(seconds: float) -> str:
    """A time.Duration as Go prints it (`10s`, `1m30s`, `1.5s`, `500ms`, `0s`)."""
    nanos = round(seconds * 1e9)
    if nanos == 0:
        return "0s"
    sign, nanos = ("-" if nanos < 0 else ""), abs(nanos)
    if nanos < 10**9:
        for unit, size in (("ms", 10**6), ("µs", 10**3), ("ns", 1)):
            if nanos >= size:
                return sign + _trim(nanos / size, size) + unit
    hours, rest = divmod(nanos, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    text = _trim(rest / 10**9, 10**9) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    return f"{sign}{minutes}m{text}" if minutes else sign + text


def _trim(value: float, size: int) -> str:
    digits = len(str(size)) - 1
    return f"{value:.{digits}f}".rstrip("0").rstrip(".") if digits else str(int(value))


def go_str(value: Any) -> str:
    """fmt.Sprint of one value."""
    if value is None:
        return NO_VALUE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return "map[" + " ".join(f"{go_str(k)}:{go_str(value[k])}" for k in sorted(value, key=str)) + "]"
    if isinstance(value, list | tuple):
        return "[" + " ".join(go_str(v) for v in value) + "]"
    return str(value)


def truthy(value: Any) -> bool:
    """Go template truth: false, 0, nil and empty strings/lists/maps are false."""
    if value is None or value is False:
        return False
    if isinstance(value, int | float | str | list | tuple | Mapping):
        return bool(value)
    return True


def js_escape(value: Any) -> str:
    """text/template's `js`: escape quotes, backslashes, `<>&=` and control characters."""
    out = []
    for ch in go_str(value):
        if ch in "\\'\"":
            out.append("\\" + ch)
        elif ch in "<>&=" or ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return "".join(out)
