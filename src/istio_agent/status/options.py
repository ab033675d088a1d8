"""What the status server on :15020 serves, resolved once at agent start.

Light on purpose (the options resolver imports it before anything runs): the
server itself (`status/server.py`, with its HTTP stack) loads only when it starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from istio_agent.status.merged_metrics.merge import MetricsOptions
from istio_agent.status.probes.rules import ProbeOptions


@dataclass(frozen=True)
class StatusOptions:
    """The status server: where it listens, whether there is an Envoy to ask, app probes and merged metrics."""

    port: int = 15020
    host: str = "0.0.0.0"
    envoy_enabled: bool = True  # False (DISABLE_ENVOY): readiness is the gRPC bootstrap's, not Envoy's
    dns_enabled: bool = False  # ready only once the DNS proxy has a NameTable (sidecars with Envoy)
    probes: ProbeOptions = field(default_factory=ProbeOptions)
    metrics: MetricsOptions = field(default_factory=MetricsOptions)
    profiling: bool = True  # --profiling: /debug/pprof/ (status/profiling.py)
