"""Readiness rules for `/healthz/ready`, as upstream's probe applies them (sans-IO).

With Envoy, ready means: Envoy has accepted configuration (CDS and LDS each
updated successfully at least once: a rejected update is not enough, and the
reason then says it was rejected), its server is LIVE (`server.state` 0) with
workers started, and, when the DNS proxy is on, a NameTable has arrived. Once
Envoy has been ready it stays ready (those stats never go back within one
Envoy), so later probes do not hit the admin API.

Without Envoy (proxyless gRPC), Envoy's part is skipped. In both cases a gRPC
bootstrap, when the agent writes one, must load and its certificate files must
exist (upstream's gRPC probe); the caller runs that check and passes its
result. Draining makes the agent unready again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

SERVER_LIVE = 0


DRAINING = "server is not live, current state is: DRAINING"


@dataclass
class ReadinessState:
    dns_enabled: bool = False
    envoy_enabled: bool = True
    name_table_received: bool = False
    draining: bool = False
    envoy_ready_once: bool = False
    last_reason: str = field(default="not probed yet")
    # Told once, when Envoy is first found ready (upstream records its startup_duration_seconds then).
    on_first_ready: Callable[[], None] | None = None

    def needs_envoy_stats(self) -> bool:
        return self.envoy_enabled and not self.envoy_ready_once and not self.draining

    def evaluate(self, update_stats: dict[str, int] | None, ready_stats: dict[str, int] | None,
                 bootstrap_problem: str | None = None) -> str | None:
        """None when ready, else the reason; stats are None when they could not be fetched.

        `bootstrap_problem` is the gRPC bootstrap check's answer (None: fine, or no bootstrap).
        """
        reason = self._reason(update_stats, ready_stats) or bootstrap_problem
        self.last_reason = reason or "ready"
        return reason

    def _reason(self, update_stats: dict[str, int] | None, ready_stats: dict[str, int] | None) -> str | None:
        if self.draining:
            return DRAINING
        if not self.envoy_enabled:
            return None
        if not self.envoy_ready_once:
            if update_stats is None or ready_stats is None:
                return "Envoy admin API not reachable yet"
            problem = config_problem(update_stats)
            if problem:
                return problem
            if "server.state" not in ready_stats:
                return "server.state is not yet updated"
            if ready_stats["server.state"] != SERVER_LIVE:
                return f"server is not live, current state is: {ready_stats['server.state']}"
            if ready_stats.get("listener_manager.workers_started") != 1:
                return "workers have not yet started"
            self.envoy_ready_once = True
            if self.on_first_ready is not None:
                self.on_first_ready()
        if self.dns_enabled and not self.name_table_received:
            return "DNS proxy has not received a NameTable yet"
        return None


def config_problem(update_stats: dict[str, int]) -> str | None:
    """Why Envoy's configuration does not count yet (None: CDS and LDS each had a successful update)."""
    cds_ok = update_stats.get("cluster_manager.cds.update_success", 0)
    cds_rejected = update_stats.get("cluster_manager.cds.update_rejected", 0)
    lds_ok = update_stats.get("listener_manager.lds.update_success", 0)
    lds_rejected = update_stats.get("listener_manager.lds.update_rejected", 0)
    if cds_ok > 0 and lds_ok > 0:
        return None
    counts = (f"cds updates: {cds_ok} successful, {cds_rejected} rejected; "
              f"lds updates: {lds_ok} successful, {lds_rejected} rejected")
    if cds_ok == 0 and lds_ok == 0:
        return f"config not received from XDS server (is Istiod running?): {counts}"
    if cds_rejected > 0 or lds_rejected > 0:
        return f"config received from XDS server, but was rejected: {counts}"
    return f"config not fully received from XDS server: {counts}"
