"""xDS type URLs istiod-local serves (and the ones it only acknowledges)."""

from __future__ import annotations

from istio_agent.protos.typeurls import (
    CLUSTER,
    ENDPOINT,
    HEALTH_INFO,
    LISTENER,
    NAME_TABLE,
    PREFIX,
    PROXY_CONFIG,
    ROUTE,
    SECRET,
    short,
)

# Types where an empty subscription means "everything" (SotW and legacy Delta wildcard).
WILDCARD_TYPES = frozenset({CLUSTER, LISTENER, NAME_TABLE})

# Push order: clusters before their endpoints, listeners before their routes (make before break).
PUSH_ORDER = (CLUSTER, ENDPOINT, LISTENER, ROUTE, NAME_TABLE)

__all__ = ["CLUSTER", "ENDPOINT", "HEALTH_INFO", "LISTENER", "NAME_TABLE", "PREFIX", "PROXY_CONFIG", "PUSH_ORDER",
           "ROUTE", "SECRET", "WILDCARD_TYPES", "short"]
