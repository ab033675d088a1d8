"""Readiness rules for `/healthz/ready`, as upstream's probe applies them (sans-IO).

Ready means: Envoy has received configuration (CDS and LDS each updated or
rejected at least once), its server is LIVE (`server.state` 0) with workers
started, and, when the DNS proxy is on, a NameTable has arrived. Once Envoy has
been ready it stays ready (those stats never go back within one Envoy), so
later probes do not hit the admin API; draining makes it unready again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SERVER_LIVE = 0


@dataclass
class ReadinessState:
    dns_enabled: bool = False
    name_table_received: bool = False
    draining: bool = False
    envoy_ready_once: bool = False
    last_reason: str = field(default="not probed yet")

    def needs_envoy_stats(self) -> bool:
        return not self.envoy_ready_once

    def evaluate(self, update_stats: dict[str, int] | None, ready_stats: dict[str, int] | None) -> str | None:
        """None when ready, else the reason; stats are None when they could not be fetched."""
        reason = self._reason(update_stats, ready_stats)
        self.last_reason = reason or "ready"
        return reason

    def _reason(self, update_stats: dict[str, int] | None, ready_stats: dict[str, int] | None) -> str | None:
        if self.draining:
            return "server is not live, current state is: DRAINING"
        if not self.envoy_ready_once:
            if update_stats is None or ready_stats is None:
                return "Envoy admin API not reachable yet"
            cds = update_stats.get("cluster_manager.cds.update_success", 0) + update_stats.get(
                "cluster_manager.cds.update_rejected", 0)
            lds = update_stats.get("listener_manager.lds.update_success", 0) + update_stats.get(
                "listener_manager.lds.update_rejected", 0)
            if not (cds > 0 and lds > 0):
                return (
                    "config not received from XDS server (is Istiod running?): "
                    f"cds updates: {update_stats.get('cluster_manager.cds.update_success', 0)} successful, "
                    f"{update_stats.get('cluster_manager.cds.update_rejected', 0)} rejected; "
                    f"lds updates: {update_stats.get('listener_manager.lds.update_success', 0)} successful, "
                    f"{update_stats.get('listener_manager.lds.update_rejected', 0)} rejected"
                )
            if "server.state" not in ready_stats:
                return "server.state is not yet updated"
            if ready_stats["server.state"] != SERVER_LIVE:
                return f"server is not live, current state is: {ready_stats['server.state']}"
            if ready_stats.get("listener_manager.workers_started") != 1:
                return "workers have not yet started"
            self.envoy_ready_once = True
        if self.dns_enabled and not self.name_table_received:
            return "DNS proxy has not received a NameTable yet"
        return None
