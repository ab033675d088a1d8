"""The plugin's log lines as they arrive on the log socket (upstream's cni/pkg/log/uds.go format), parsed.

The plugin POSTs `/log` with a JSON array of strings, each string one JSON log
entry: `level`, `time` (RFC 3339, nanoseconds), `msg`, and any other keys as
labels. An entry that does not parse, or lacks one of the three, is skipped, as
upstream does; a level other than debug/info/warn/error is dropped (the plugin
has no fatal). Pure.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}
_FRACTION = re.compile(r"(\.\d{1,6})\d*")


class PluginLogError(ValueError):
    """The body is not a JSON array of strings."""


@dataclass(frozen=True)
class PluginLogLine:
    level: int
    time: float  # seconds since the epoch, the plugin's clock
    msg: str
    labels: tuple[tuple[str, Any], ...] = ()

    def text(self) -> str:
        """The message with its labels appended (`msg\tkey=value ...`, keys sorted)."""
        if not self.labels:
            return self.msg
        return self.msg + "\t" + " ".join(f"{k}={json.dumps(v) if not isinstance(v, str) else v}"
                                          for k, v in self.labels)


def parse_rfc3339(text: str) -> float:
    """Go's time.Time JSON form (RFC 3339 with up to nanoseconds) -> epoch seconds."""
    normalized = _FRACTION.sub(lambda m: m.group(1), text.strip().replace("z", "Z"), count=1)
    normalized = normalized[:-1] + "+00:00" if normalized.endswith("Z") else normalized
    return datetime.fromisoformat(normalized).timestamp()


def parse_entry(raw: str) -> PluginLogLine | None:
    try:
        entry = json.loads(raw)
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
        entries = json.loads(body)
    except ValueError as exc:
        raise PluginLogError(f"Failed to unmarshal CNI plugin logs: {exc}") from None
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise PluginLogError("Failed to unmarshal CNI plugin logs: expected a JSON array of strings")
    return [line for line in map(parse_entry, entries) if line is not None]
