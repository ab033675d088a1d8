"""xDS type URLs and their short names: the one set, for the agent (XDS proxy, SDS, diagnostics) and istiod-local.

A plain library (no I/O, no agent runtime), so both separate programs can use
it. Values follow upstream's `pkg/model` constants.
"""

from __future__ import annotations

PREFIX = "type.googleapis.com/"
ENVOY_PREFIX = PREFIX + "envoy."

CLUSTER = PREFIX + "envoy.config.cluster.v3.Cluster"
ENDPOINT = PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER = PREFIX + "envoy.config.listener.v3.Listener"
ROUTE = PREFIX + "envoy.config.route.v3.RouteConfiguration"
SECRET = PREFIX + "envoy.extensions.transport_sockets.tls.v3.Secret"
EXTENSION_CONFIG = PREFIX + "envoy.config.core.v3.TypedExtensionConfig"
NAME_TABLE = PREFIX + "istio.networking.nds.v1.NameTable"
HEALTH_INFO = PREFIX + "istio.v1.HealthInformation"
PROXY_CONFIG = PREFIX + "istio.mesh.v1alpha1.ProxyConfig"
WORKLOAD = PREFIX + "istio.workload.Workload"
# Not an xDS type: the `@type` of the secrets section of Envoy's admin /config_dump.
SECRETS_CONFIG_DUMP = PREFIX + "envoy.admin.v3.SecretsConfigDump"

SHORT_NAMES = {
    CLUSTER: "CDS",
    ENDPOINT: "EDS",
    LISTENER: "LDS",
    ROUTE: "RDS",
    SECRET: "SDS",
    EXTENSION_CONFIG: "ECDS",
    NAME_TABLE: "NDS",
    PROXY_CONFIG: "PCDS",
    HEALTH_INFO: "HEALTH",
    WORKLOAD: "WDS",
}


def short(type_url: str) -> str:
    """A log-friendly name (`CDS`, `NDS`, ...), or the URL itself when unknown."""
    return SHORT_NAMES.get(type_url, type_url)
