"""Go's strconv.Unquote, which is how upstream reads each value of a downward-API labels/annotations file.

Kubernetes writes those values Go-quoted (`key="value"`, with `\\n`, `\\"`, `\\u00e9`
escapes); reading them any other way changes a multi-line `proxy.istio.io/config`
annotation or refuses what upstream accepts. JSON string syntax is close but not
the same (octal and `\\x` escapes, `\\a` and `\\v`, raw backquoted strings).
"""

from __future__ import annotations

_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}
_HEX_LENGTH = {"x": 2, "u": 4, "U": 8}


def go_unquote(text: str) -> str:
    """The value of a Go string literal ("...", `...` or a one-character '...'); ValueError when it is not one."""
    if len(text) < 2 or text[0] != text[-1] or text[0] not in "\"'`":
        raise ValueError(f"not a quoted string: {text!r}")
    quote, body = text[0], text[1:-1]
    if quote == "`":
        if "`" in body:
            raise ValueError(f"backquote inside a raw string: {text!r}")
        return body.replace("\r", "")
    if "\n" in body:
        raise ValueError(f"newline inside a quoted string: {text!r}")
    out = _unescape(body, quote, text)
    if quote == "'" and len(out) != 1:
        raise ValueError(f"a single-quoted literal holds one character: {text!r}")
    return out


def _unescape(body: str, quote: str, text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char == quote:
            raise ValueError(f"unescaped {quote} inside {text!r}")
        if char != "\\":
            out.append(char)
            i += 1
            continue
        if i + 1 >= len(body):
            raise ValueError(f"trailing backslash in {text!r}")
        kind = body[i + 1]
        if kind in _SIMPLE:
            out.append(_SIMPLE[kind])
            i += 2
        elif kind == quote:  # \" inside "...", \' inside '...'; never the other one
            out.append(kind)
            i += 2
        elif kind in _HEX_LENGTH:
            digits = body[i + 2:i + 2 + _HEX_LENGTH[kind]]
            if len(digits) != _HEX_LENGTH[kind] or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(f"bad \\{kind} escape in {text!r}")
            value = int(digits, 16)
            if kind == "x":
                out.append(chr(value))  # a byte; upstream keeps it as one (labels are ASCII in practice)
            elif value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
                raise ValueError(f"\\{kind}{digits} is not a Unicode code point in {text!r}")
            else:
                out.append(chr(value))
            i += 2 + _HEX_LENGTH[kind]
        elif kind in "01234567":
            digits = body[i + 1:i + 4]
            if len(digits) != 3 or any(d not in "01234567" for d in digits) or int(digits, 8) > 255:
                raise ValueError(f"bad octal escape in {text!r}")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise ValueError(f"unknown escape \\{kind} in {text!r}")
    return "".join(out)
