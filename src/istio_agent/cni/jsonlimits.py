"""JSON the Istio CNI reads from others, read with a nesting limit: the runtime's stdin (`istio-cni`), the node's
network configs and the plugin's log lines (`install-cni`).

Python's `json` nests by recursion, so a document of a few kilobytes of `[` raises RecursionError (not a
ValueError) from the parser, and a shallower one can still exhaust the stack later, in the indented writer
the plugin prints results with or the Go-style one install-cni writes conflists with. Go's encoding/json,
which libcni and upstream's plugin decode with, refuses documents nested deeper than 10000. The limit here
is `MAX_DEPTH` (128): the deepest real network config nests under 10 levels, and 128 keeps every parse
and every write of what was read well inside Python's recursion limit (1000 frames), on whichever thread
does it. A deeper document is refused before it is parsed, as a ValueError (`TooDeep`) naming the limit,
so every caller's existing "not JSON" path reports it.

`exceeds_depth` counts brackets outside strings (a regular expression skips strings whole) and stops at
the limit, so a hostile document costs no more than the limit's worth of matches; a document with fewer
brackets than the limit is not scanned at all.
"""

from __future__ import annotations

import json
import re

MAX_DEPTH = 128
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_OPEN = frozenset(b"[{")


class TooDeep(ValueError):
    """A JSON document nested deeper than the limit (refused before parsing)."""


def exceeds_depth(data: str | bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether `data` opens more than `limit` arrays/objects inside one another (strings skipped; pure)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    depth = 0
    for match in _TOKENS.finditer(raw):
        first = raw[match.start()]
        if first in _OPEN:
            depth += 1
            if depth > limit:
                return True
        elif first != 0x22:  # a closing bracket (0x22: a string, skipped whole)
            depth -= 1
    return False


def loads(data: str | bytes, limit: int = MAX_DEPTH) -> object:
    """`json.loads`, refusing (TooDeep, a ValueError) a document nested deeper than `limit`."""
    if exceeds_depth(data, limit):
        raise TooDeep(f"JSON nested deeper than {limit} levels")
    try:
        return json.loads(data)
    except RecursionError:  # a stack already deep when called: still a refusal, never a crash
        raise TooDeep(f"JSON nested too deeply to read (limit {limit} levels)") from None
