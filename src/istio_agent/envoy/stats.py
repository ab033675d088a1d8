"""Reading Envoy's admin `/stats` text (`name: value` per line) and what the agent needs from it."""

from __future__ import annotations

from collections.abc import Iterable


def istio_listener_stats(ports: Iterable[int]) -> frozenset[str]:
    """The `downstream_cx_active` stats of the listeners Istio itself owns (admin, and the bootstrap's
    status, Prometheus and secure metrics listeners on `ports`): they never count as application
    traffic while draining."""
    names = {"listener.admin.downstream_cx_active", "listener.admin.main_thread.downstream_cx_active"}
    for port in ports:
        if port:
            names |= {f"listener.0.0.0.0_{port}.downstream_cx_active", f"listener.[__]_{port}.downstream_cx_active"}
    return frozenset(names)


# With the default ports (ENVOY_STATUS_PORT 15021, ENVOY_PROMETHEUS_PORT 15090, no secure metrics).
ISTIO_LISTENER_STATS = istio_listener_stats((15090, 15021))
# Envoy's internal listeners (ambient HBONE plumbing) hold pipe connections, never client ones.
INTERNAL_LISTENER_PREFIX = "listener.envoy_internal_"

READY_STATS_FILTER = r"^(server\.state|listener_manager\.workers_started)"
UPDATE_STATS_FILTER = r"^(cluster_manager\.cds|listener_manager\.lds)\.(update_success|update_rejected)$"
ACTIVE_CONNECTIONS_FILTER = "downstream_cx_active$"


def parse_stats(text: str) -> dict[str, int]:
    """Integer stats by name; lines that are not `name: <integer>` (histograms, text) are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if not sep:
            continue
        try:
            out[name.strip()] = int(value.strip())
        except ValueError:
            continue
    return out


def active_downstream_connections(stats: dict[str, int],
                                  istio_listeners: frozenset[str] = ISTIO_LISTENER_STATS) -> int | None:
    """Downstream connections still open on application listeners; None when Envoy reports none at all.

    Only `listener.*` stats count (the `http.*` twins would double-count), per-worker
    breakdowns are skipped, and Istio's own listeners (`istio_listeners`) and Envoy's
    internal listeners are excluded.
    """
    relevant = {
        name: value for name, value in stats.items()
        if name.startswith("listener.") and name.endswith("downstream_cx_active") and "worker_" not in name
    }
    if not relevant:
        return None
    return sum(value for name, value in relevant.items()
               if name not in istio_listeners and not name.startswith(INTERNAL_LISTENER_PREFIX))
