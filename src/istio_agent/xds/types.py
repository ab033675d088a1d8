"""Type URLs the proxy knows, and which of them may reach Envoy.

Values follow upstream's `pkg/model` constants. Only Envoy API types (and the
ambient `Workload` type) are forwarded downstream; Istio's own types are for
the agent, and anything else is dropped rather than confuse Envoy.
"""

from __future__ import annotations

from istio_agent.protos import typeurls

API_TYPE_PREFIX = typeurls.PREFIX
ENVOY_TYPE_PREFIX = typeurls.ENVOY_PREFIX

CLUSTER_TYPE = typeurls.CLUSTER
ENDPOINT_TYPE = typeurls.ENDPOINT
LISTENER_TYPE = typeurls.LISTENER
ROUTE_TYPE = typeurls.ROUTE
SECRET_TYPE = typeurls.SECRET
EXTENSION_CONFIG_TYPE = typeurls.EXTENSION_CONFIG

NAME_TABLE_TYPE = typeurls.NAME_TABLE
HEALTH_INFO_TYPE = typeurls.HEALTH_INFO
PROXY_CONFIG_TYPE = typeurls.PROXY_CONFIG
WORKLOAD_TYPE = typeurls.WORKLOAD

ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
SOTW_METHOD = f"/{ADS_SERVICE}/StreamAggregatedResources"
DELTA_METHOD = f"/{ADS_SERVICE}/DeltaAggregatedResources"

# google.rpc.Code INTERNAL, which upstream puts in NACKs and unhealthy reports.
CODE_INTERNAL = 13

def is_envoy_type(type_url: str) -> bool:
    return type_url.startswith(ENVOY_TYPE_PREFIX)


def forwardable(type_url: str) -> bool:
    """Whether a response of this type may be sent to Envoy (upstream's rule)."""
    return is_envoy_type(type_url) or type_url == WORKLOAD_TYPE


short_type = typeurls.short
