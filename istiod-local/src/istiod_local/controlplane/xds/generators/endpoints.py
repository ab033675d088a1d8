"""EDS: one ClusterLoadAssignment per EDS cluster, endpoints grouped by locality.

Every endpoint and every locality group carries a `load_balancing_weight`
(gRPC's xDS client ignores endpoints without one), and mesh endpoints carry
the `tlsMode: istio` metadata that selects the cluster's mTLS transport
socket when, as upstream's endpoint builder decides, the workload can take
mTLS (its `security.istio.io/tlsMode`: a sidecar pod, a WorkloadEntry with a
service account) and its namespace's PeerAuthentication is not DISABLE;
other endpoints get plaintext (auto mTLS). A cluster with no endpoints still gets an (empty) assignment, so
Envoy does not keep the cluster warming.
"""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2

from istiod_local.controlplane.xds.generators.base import Resources
from istiod_local.controlplane.xds.generators.envoy import (
    TLS_MODE_METADATA_KEY,
    metadata,
    outbound_cluster_name,
    pack,
    socket_address,
    uint32,
)
from istiod_local.controlplane.xds.mesh import TLS_MODE_ISTIO, Endpoint, Locality, MeshSnapshot, ServiceView
from istiod_local.controlplane.xds.registry import ServicePort

_ISTIO_TLS = metadata({TLS_MODE_METADATA_KEY: {"tlsMode": "istio"}})


def _lb_endpoint(endpoint: Endpoint, mesh: bool) -> endpoint_components_pb2.LbEndpoint:
    out = endpoint_components_pb2.LbEndpoint(
        endpoint=endpoint_components_pb2.Endpoint(address=socket_address(endpoint.address, endpoint.port)),
        health_status=health_check_pb2.HEALTHY,
        load_balancing_weight=uint32(endpoint.workload.weight if endpoint.workload and endpoint.workload.weight else 1),
    )
    if mesh:
        out.metadata.CopyFrom(_ISTIO_TLS)
    return out


def _takes_mtls(snapshot: MeshSnapshot, endpoint: Endpoint) -> bool:
    workload = endpoint.workload
    if workload is None or workload.tls_mode != TLS_MODE_ISTIO:
        return False
    return snapshot.registry.mtls_mode(workload.namespace) != "DISABLE"


def load_assignment(snapshot: MeshSnapshot, view: ServiceView, port: ServicePort) -> endpoint_pb2.ClusterLoadAssignment:
    name = outbound_cluster_name(port.port, view.hostname)
    groups: dict[Locality, list[endpoint_components_pb2.LbEndpoint]] = {}
    for endpoint in snapshot.endpoints(view, port):
        groups.setdefault(endpoint.locality, []).append(_lb_endpoint(endpoint, _takes_mtls(snapshot, endpoint)))
    localities = []
    for locality in sorted(groups, key=lambda loc: (loc.region, loc.zone, loc.subzone)):
        eps = groups[locality]
        localities.append(endpoint_components_pb2.LocalityLbEndpoints(
            locality=base_pb2.Locality(region=locality.region, zone=locality.zone, sub_zone=locality.subzone),
            lb_endpoints=eps,
            load_balancing_weight=uint32(sum(e.load_balancing_weight.value for e in eps)),
        ))
    return endpoint_pb2.ClusterLoadAssignment(cluster_name=name, endpoints=localities)


def build_endpoints(snapshot: MeshSnapshot) -> Resources:
    """Assignments for every EDS cluster (mesh services and STATIC service entries), once per snapshot."""
    cached = snapshot.memo.get("eds")
    if cached is None:
        cached = {}
        for view in snapshot.services:
            if view.resolution not in ("EDS", "STATIC"):
                continue
            for port in view.ports:
                cla = load_assignment(snapshot, view, port)
                cached[cla.cluster_name] = pack(cla)
        snapshot.memo["eds"] = cached
    return cached
