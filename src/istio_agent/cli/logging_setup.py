"""Logging flags shared by every command, with Istio's spellings.

`--log_output_level` takes `scope:level` pairs (`default:info,ads:debug`);
Istio scope names map onto our logger names so the familiar flags work.
"""

from __future__ import annotations

import json
import logging
import sys
import time

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


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "scope": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(output_level: str = "default:info", as_json: bool = False) -> None:
    """Configure the root handler and per-scope levels; unknown scopes are created as loggers."""
    handler = logging.StreamHandler(sys.stderr)
    if as_json:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s\t%(levelname)s\t%(name)s\t%(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("istio_agent").setLevel(logging.INFO)
    for part in filter(None, (p.strip() for p in output_level.split(","))):
        scope, sep, level = part.rpartition(":")
        if not sep:
            scope, level = "default", part
        logger_name = SCOPES.get(scope, f"istio_agent.{scope}")
        logging.getLogger(logger_name).setLevel(_LEVELS.get(level.lower(), logging.INFO))
