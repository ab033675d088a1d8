"""The plugin's log lines as they arrive on the log socket (upstream's cni/pkg/log/uds.go format), parsed.

The plugin POSTs `/log` with a JSON array of strings, each string one JSON log
entry: `level`, `time` (RFC 3339, nanoseconds), `msg`, and any other keys as
labels. An entry that does not parse, or lacks one of the three, is skipped, as
upstream does; a level other than debug/info/warn/error is dropped (the plugin
has no fatal). Pure.

The socket is 0666, as upstream's, so any pod user on the node can post to it: a line's text
(`PluginLogLine.text`) escapes every control character, line and paragraph separators included, in the
message and in each label, so that one entry is one line of install-cni's log whatever it contains (a
message cannot end our line and forge another, e.g. a `cni-agent` one). Bodies and entries nested deeper
than `jsonlimits.MAX_DEPTH` are refused as bodies that do not parse.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from istio_agent.cni.jsonlimits import loads as load_json

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}
_FRACTION = re.compile(r"(\.\d{1,6})\d*")
# Control characters (C0, DEL, C1) and Unicode's line and paragraph separators, as visible escapes.
_ONE_LINE = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}
_ONE_LINE.update({0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"})


def one_line(text: str) -> str:
    """`text` with every character that could end or rewrite a log line escaped (`\\n`, `\\x1b`, ...)."""
    return text.translate(_ONE_LINE)


class PluginLogError(ValueError):
    """The body is not a JSON array of strings."""


@dataclass(frozen=True)
class PluginLogLine:
    level: int
    time: float  # seconds since the epoch, the plugin's clock
    msg: str
    labels: tuple[tuple[str, Any], ...] = ()

    def text(self) -> str:
        """The message with its labels appended (`msg\tkey=value ...`, keys sorted): one line, always."""
        if not self.labels:
            return one_line(self.msg)
        return one_line(self.msg) + "\t" + " ".join(
            f"{one_line(k)}={one_line(json.dumps(v) if not isinstance(v, str) else v)}" for k, v in self.labels)


def parse_rfc3339(text: str) -> float:
    """Go's time.Time JSON form (RFC 3339 with up to nanoseconds) -> epoch seconds."""
    normalized = _FRACTION.sub(lambda m: m.group(1), text.strip().replace("z", "Z"), count=1)
    normalized = normalized[:-1] + "+00:00" if normalized.endswith("Z") else normalized
    return datetime.fromisoformat(normalized).timestamp()


def parse_entry(raw: str) -> PluginLogLine | None:
    try:
        entry = load_json(raw)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    msg, level, when = entry.pop("msg", None), entry.pop("level", None), entry.pop("time", None)
    if not isinstance(msg, str) or not isinstance(level, str) or not isinstance(when, str):
        return None
    try:
        seconds = parse_rfc3339(when)
    except ValueError:
        return None
    if level not in LEVELS:
        return None
    return PluginLogLine(LEVELS[level], seconds, msg.strip(), tuple(sorted(entry.items())))


def parse_body(body: bytes) -> list[PluginLogLine]:
    """Every usable entry of a POST /log body; PluginLogError when the body is not a JSON array of strings."""
    try:
        entries = load_json(body)
    except ValueError as exc:
        raise PluginLogError(f"Failed to unmarshal CNI plugin logs: {exc}") from None
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise PluginLogError("Failed to unmarshal CNI plugin logs: expected a JSON array of strings")
    return [line for line in map(parse_entry, entries) if line is not None]
