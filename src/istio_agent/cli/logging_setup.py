"""Logging flags shared by every command, with Istio's spellings and defaults.

- `--log_output_level` takes `scope:level` pairs (`default:info,ads:debug`, or a bare level);
- `--log_target` (repeatable) is where logs go: `stdout` (upstream's default), `stderr`, or a file;
- `--log_as_json` writes one JSON object a line;
- `--log_caller` lists scopes whose lines carry the caller (`file:line`);
- `--log_stacktrace_level` gives `scope:level` pairs at which a line carries the stack.

Istio's scope names map onto our logger names, so the familiar flags work. The
pure part (`LogOptions`, parsing) is separate from `configure_logging`, which
installs the handlers.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
    "none": logging.CRITICAL + 10,
}

# Istio scope -> our logger names.
SCOPES = {
    "default": "istio_agent",
    "ads": "istio_agent.xds",
    "xdsproxy": "istio_agent.xds",
    "sds": "istio_agent.security",
    "cache": "istio_agent.security",
    "citadelclient": "istio_agent.security",
    "dns": "istio_agent.dns",
    "envoy": "istio_agent.envoy",
    "healthcheck": "istio_agent.status",
    "status": "istio_agent.status",
    "iptables": "istio_agent.capture",
    "cni": "istio_agent.cni",
}


@dataclass(frozen=True)
class LogOptions:
    """The root logging flags of every command, parsed."""

    output_level: str = "default:info"
    as_json: bool = False
    targets: tuple[str, ...] = ("stdout",)
    callers: tuple[str, ...] = ()
    stacktrace_levels: str = "default:none"


def logger_for(scope: str) -> str:
    return SCOPES.get(scope, f"istio_agent.{scope}")


def scope_levels(text: str) -> dict[str, int]:
    """`scope:level,...` (a bare level means `default`) -> {logger name: level}; unknown levels mean info."""
    levels: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        scope, sep, level = part.rpartition(":")
        if not sep:
            scope, level = "default", part
        levels[logger_for(scope)] = _LEVELS.get(level.lower(), logging.INFO)
    return levels


def _applies(record: logging.LogRecord, logger_names: Iterable[str]) -> str | None:
    """The most specific of `logger_names` that is `record`'s logger or one of its parents."""
    best: str | None = None
    for name in logger_names:
        if (record.name == name or record.name.startswith(name + ".")) and (best is None or len(name) > len(best)):
            best = name
    return best


class _ScopeDetails(logging.Filter):
    """Adds the caller for `--log_caller` scopes and the stack for `--log_stacktrace_level` scopes."""

    def __init__(self, callers: Sequence[str], stack_levels: dict[str, int]) -> None:
        super().__init__()
        self.callers = [logger_for(scope) for scope in callers]
        self.stack_levels = stack_levels

    def filter(self, record: logging.LogRecord) -> bool:
        record.caller = f"{record.filename}:{record.lineno}\t" if _applies(record, self.callers) else ""
        name = _applies(record, self.stack_levels)
        if name is not None and record.levelno >= self.stack_levels[name] and not record.stack_info:
            record.stack_info = "".join(traceback.format_stack()[:-6])
        return True


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "scope": record.name,
            "msg": record.getMessage(),
        }
        if getattr(record, "caller", ""):
            entry["caller"] = str(getattr(record, "caller", "")).strip()
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry)


def _stream(target: str) -> IO[str]:
    if target == "stdout":
        return sys.stdout
    if target == "stderr":
        return sys.stderr
    return open(target, "a", encoding="utf-8", buffering=1)


def configure_logging(options: LogOptions | str = LogOptions(), as_json: bool | None = None) -> None:
    """Install handlers for every target and the per-scope levels; unknown scopes are created as loggers.

    A plain string is taken as `--log_output_level` (older callers).
    """
    if isinstance(options, str):
        options = LogOptions(output_level=options, as_json=bool(as_json))
    details = _ScopeDetails(options.callers, scope_levels(options.stacktrace_levels))
    formatter: logging.Formatter = (
        _JsonFormatter() if options.as_json
        else logging.Formatter("%(asctime)s\t%(levelname)s\t%(name)s\t%(caller)s%(message)s"))
    handlers: list[logging.Handler] = []
    for target in options.targets or ("stdout",):
        handler = logging.StreamHandler(_stream(target))
        handler.setFormatter(formatter)
        handler.addFilter(details)
        handlers.append(handler)
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(logging.WARNING)
    logging.getLogger("istio_agent").setLevel(logging.INFO)
    for logger_name, level in scope_levels(options.output_level).items():
        logging.getLogger(logger_name).setLevel(level)
