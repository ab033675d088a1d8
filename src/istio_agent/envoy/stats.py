"""Reading Envoy's admin `/stats` text (`name: value` per line) and what the agent needs from it."""

from __future__ import annotations

# Listeners Istio itself owns: they never count as application traffic while draining.
ISTIO_LISTENER_STATS = frozenset({
    "listener.admin.downstream_cx_active",
    "listener.admin.main_thread.downstream_cx_active",
    "listener.0.0.0.0_15090.downstream_cx_active",
    "listener.0.0.0.0_15021.downstream_cx_active",
    "listener.[__]_15090.downstream_cx_active",
    "listener.[__]_15021.downstream_cx_active",
})

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


def active_downstream_connections(stats: dict[str, int]) -> int | None:
    """Downstream connections still open on application listeners; None when Envoy reports none at all.

    Only `listener.*` stats count (the `http.*` twins would double-count), per-worker
    breakdowns are skipped, and Istio's own listeners (admin, 15090, 15021) are excluded.
    """
    relevant = {
        name: value for name, value in stats.items()
        if name.startswith("listener.") and name.endswith("downstream_cx_active") and "worker_" not in name
    }
    if not relevant:
        return None
    return sum(value for name, value in relevant.items() if name not in ISTIO_LISTENER_STATS)
