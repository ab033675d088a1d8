"""xDS type URLs istiod-local serves (and the ones it only acknowledges)."""

from __future__ import annotations

PREFIX = "type.googleapis.com/"
CLUSTER = PREFIX + "envoy.config.cluster.v3.Cluster"
ENDPOINT = PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment"
LISTENER = PREFIX + "envoy.config.listener.v3.Listener"
ROUTE = PREFIX + "envoy.config.route.v3.RouteConfiguration"
SECRET = PREFIX + "envoy.extensions.transport_sockets.tls.v3.Secret"
NAME_TABLE = PREFIX + "istio.networking.nds.v1.NameTable"
HEALTH_INFO = PREFIX + "istio.v1.HealthInformation"
PROXY_CONFIG = PREFIX + "istio.mesh.v1alpha1.ProxyConfig"

# Types where an empty subscription means "everything" (SotW and legacy Delta wildcard).
WILDCARD_TYPES = frozenset({CLUSTER, LISTENER, NAME_TABLE})

# Push order: clusters before their endpoints, listeners before their routes (make before break).
PUSH_ORDER = (CLUSTER, ENDPOINT, LISTENER, ROUTE, NAME_TABLE)

SHORT_NAMES = {CLUSTER: "CDS", ENDPOINT: "EDS", LISTENER: "LDS", ROUTE: "RDS", SECRET: "SDS", NAME_TABLE: "NDS",
               PROXY_CONFIG: "PCDS", HEALTH_INFO: "HEALTH"}


def short(type_url: str) -> str:
    return SHORT_NAMES.get(type_url, type_url)
