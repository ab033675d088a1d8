"""Durations as Istio's users write them.

Mesh config and ProxyConfig carry protobuf `Duration`s in their JSON form
(`"45s"`, `"0.5s"`), while environment variables such as `SECRET_TTL` use Go's
`time.ParseDuration` syntax (`"24h"`, `"1h30m"`, `"500ms"`). Both are accepted
everywhere, because users mix them up and upstream tolerates both spellings in
the places that matter.
"""

from __future__ import annotations

import re

_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
# Go's time.Duration is int64 nanoseconds: ParseDuration refuses anything longer (about 292 years).
MAX_SECONDS = (2**63 - 1) / 1e9
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Parse `text` into seconds; raise ValueError naming the text when it is not a duration."""
    raw = text.strip()
    if raw in ("0", ""):
        if raw == "":
            raise ValueError("empty duration")
        return 0.0
    sign = -1.0 if raw.startswith("-") else 1.0
    body = raw.lstrip("+-")
    pos = 0
    total = 0.0
    while pos < len(body):
        match = _PART.match(body, pos)
        if match is None:
            raise ValueError(f"invalid duration {text!r}")
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos == 0:
        raise ValueError(f"invalid duration {text!r}")
    if total > MAX_SECONDS:
        raise ValueError(f"invalid duration {text!r}: longer than Go's 2562047h47m16.854775807s")
    return sign * total


def format_duration(seconds: float) -> str:
    """Render seconds in protobuf JSON form (`"45s"`, `"0.500s"`)."""
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{seconds:.9f}".rstrip("0") + "s"
