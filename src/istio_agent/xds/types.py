"""Type URLs the proxy knows, and which of them may reach Envoy.

Values follow upstream's `pkg/model` constants. Only Envoy API types (and the
ambient `Workload` type) are forwarded downstream; Istio's own types are for
the agent, and anything else is dropped rather than confuse Envoy.
"""

from __future__ import annotations

API_TYPE_PREFIX = "type.googleapis.com/"
ENVOY_TYPE_PREFIX = API_TYPE_PREFIX + "envoy."

CLUSTER_TYPE = API_TYPE_PREFIX + "envoy.config.cluster.v3.Cluster"
ENDPOINT_TYPE = API_TYPE_PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER_TYPE = API_TYPE_PREFIX + "envoy.config.listener.v3.Listener"
ROUTE_TYPE = API_TYPE_PREFIX + "envoy.config.route.v3.RouteConfiguration"
SECRET_TYPE = API_TYPE_PREFIX + "envoy.extensions.transport_sockets.tls.v3.Secret"
EXTENSION_CONFIG_TYPE = API_TYPE_PREFIX + "envoy.config.core.v3.TypedExtensionConfig"

NAME_TABLE_TYPE = API_TYPE_PREFIX + "istio.networking.nds.v1.NameTable"
HEALTH_INFO_TYPE = API_TYPE_PREFIX + "istio.v1.HealthInformation"
PROXY_CONFIG_TYPE = API_TYPE_PREFIX + "istio.mesh.v1alpha1.ProxyConfig"
WORKLOAD_TYPE = API_TYPE_PREFIX + "istio.workload.Workload"

ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
SOTW_METHOD = f"/{ADS_SERVICE}/StreamAggregatedResources"
DELTA_METHOD = f"/{ADS_SERVICE}/DeltaAggregatedResources"

# google.rpc.Code INTERNAL, which upstream puts in NACKs and unhealthy reports.
CODE_INTERNAL = 13

_SHORT = {
    CLUSTER_TYPE: "CDS",
    ENDPOINT_TYPE: "EDS",
    LISTENER_TYPE: "LDS",
    ROUTE_TYPE: "RDS",
    SECRET_TYPE: "SDS",
    EXTENSION_CONFIG_TYPE: "ECDS",
    NAME_TABLE_TYPE: "NDS",
    PROXY_CONFIG_TYPE: "PCDS",
    HEALTH_INFO_TYPE: "HEALTH",
    WORKLOAD_TYPE: "WDS",
}


def is_envoy_type(type_url: str) -> bool:
    return type_url.startswith(ENVOY_TYPE_PREFIX)


def forwardable(type_url: str) -> bool:
    """Whether a response of this type may be sent to Envoy (upstream's rule)."""
    return is_envoy_type(type_url) or type_url == WORKLOAD_TYPE


def short_type(type_url: str) -> str:
    """A log-friendly name (`CDS`, `NDS`, ...), or the URL itself when unknown."""
    return _SHORT.get(type_url, type_url)
