"""Where the XDS proxy sends what: the ADS methods it serves and dials, and which responses reach Envoy.

Type URLs themselves are in `istio_agent.protos.typeurls`. The rule here is
upstream's: only Envoy API types (and the ambient `Workload` type) are
forwarded downstream; Istio's own types are for the agent, and anything else
is dropped rather than confuse Envoy.
"""

from __future__ import annotations

from istio_agent.protos import typeurls

ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
SOTW_METHOD = f"/{ADS_SERVICE}/StreamAggregatedResources"
DELTA_METHOD = f"/{ADS_SERVICE}/DeltaAggregatedResources"

# google.rpc.Code INTERNAL, which upstream puts in the NACKs and unhealthy reports the proxy sends istiod.
CODE_INTERNAL = 13


def is_envoy_type(type_url: str) -> bool:
    return type_url.startswith(typeurls.ENVOY_PREFIX)


def forwardable(type_url: str) -> bool:
    """Whether a response of this type may be sent to Envoy (upstream's rule)."""
    return is_envoy_type(type_url) or type_url == typeurls.WORKLOAD
