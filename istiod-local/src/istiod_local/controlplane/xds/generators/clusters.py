"""CDS for sidecars: `outbound|<port>||<host>`, `inbound|<port>||` and the passthrough/blackhole clusters.

Outbound clusters of mesh services are EDS clusters that speak ISTIO_MUTUAL
to endpoints labelled `tlsMode: istio` (every registry pod runs a sidecar)
and plaintext to anything else, as upstream's auto-mTLS does with transport
socket matches. Service entries are mesh-external: plaintext, with the
resolution they ask for.

Inbound clusters deliver to the app. Upstream's default (inbound traffic
policy PASSTHROUGH) is an ORIGINAL_DST cluster bound to 127.0.0.6 so the
connection reaches the pod IP the client dialled and the capture rules let it
through; LOCALHOST sends to 127.0.0.1:<targetPort> instead.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, protocol_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import struct_pb2

from istiod_local.controlplane.xds.generators import tls
from istiod_local.controlplane.xds.generators.base import ProxyContext, Resources
from istiod_local.controlplane.xds.generators.envoy import (
    BLACKHOLE_CLUSTER,
    INBOUND_PASSTHROUGH_BIND_IPV4,
    INBOUND_PASSTHROUGH_CLUSTER,
    MAX_DURATION_SECONDS,
    PASSTHROUGH_CLUSTER,
    UINT32_MAX,
    ads_config_source,
    delimited,
    duration,
    inbound_cluster_name,
    metadata,
    outbound_cluster_name,
    outbound_sni,
    pack,
    socket_address,
)
from istiod_local.controlplane.xds.mesh import MeshSnapshot, ServiceView
from istiod_local.controlplane.xds.registry import ServicePort

HTTP_PROTOCOL_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
CONNECT_TIMEOUT_SECONDS = 10.0
ISTIO_MTLS_MATCH = {"tlsMode": "istio"}


def _circuit_breakers() -> circuit_breaker_pb2.CircuitBreakers:
    """Istio's defaults: limits effectively off, remaining capacity tracked."""
    m = UINT32_MAX
    return circuit_breaker_pb2.CircuitBreakers(thresholds=[circuit_breaker_pb2.CircuitBreakers.Thresholds(
        max_connections={"value": m}, max_pending_requests={"value": m}, max_requests={"value": m},
        max_retries={"value": m}, track_remaining=True)])


def _h2_options() -> dict[str, object]:
    options = http_protocol_options_pb2.HttpProtocolOptions(
        explicit_http_config=http_protocol_options_pb2.HttpProtocolOptions.ExplicitHttpConfig(
            http2_protocol_options=protocol_pb2.Http2ProtocolOptions()))
    return {HTTP_PROTOCOL_OPTIONS_KEY: pack(options)}


def _service_metadata(view: ServiceView) -> base_pb2.Metadata:
    service = {"host": view.hostname, "name": view.name or view.hostname, "namespace": view.namespace}
    return metadata({"istio": {"services": [service]}})


def _base(name: str, kind: int, port: ServicePort) -> cluster_pb2.Cluster:
    cluster = cluster_pb2.Cluster(
        name=name, type=kind, connect_timeout=duration(CONNECT_TIMEOUT_SECONDS),  # type: ignore[arg-type]
        circuit_breakers=_circuit_breakers(), common_lb_config=cluster_pb2.Cluster.CommonLbConfig(),
        alt_stat_name=delimited(name),
    )
    if port.is_http2:
        for key, value in _h2_options().items():
            cluster.typed_extension_protocol_options[key].CopyFrom(value)
    return cluster


def outbound_cluster(snapshot: MeshSnapshot, view: ServiceView, port: ServicePort) -> cluster_pb2.Cluster:
    name = outbound_cluster_name(port.port, view.hostname)
    if view.mesh_external:
        return _external_cluster(name, view, port)
    cluster = _base(name, cluster_pb2.Cluster.EDS, port)
    cluster.lb_policy = cluster_pb2.Cluster.LEAST_REQUEST
    cluster.eds_cluster_config.CopyFrom(cluster_pb2.Cluster.EdsClusterConfig(
        service_name=name, eds_config=ads_config_source()))
    cluster.metadata.CopyFrom(_service_metadata(view))
    mtls = tls.istio_mutual_upstream(outbound_sni(port.port, view.hostname), snapshot.service_accounts(view),
                                     port.is_http2)
    cluster.transport_socket_matches.extend([
        cluster_pb2.Cluster.TransportSocketMatch(
            name="tlsMode-istio", match=_struct(ISTIO_MTLS_MATCH), transport_socket=tls.tls_transport_socket(mtls)),
        cluster_pb2.Cluster.TransportSocketMatch(
            name="tlsMode-disabled", match=struct_pb2.Struct(), transport_socket=tls.raw_buffer_transport_socket()),
    ])
    return cluster


def _struct(value: dict[str, str]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def _external_cluster(name: str, view: ServiceView, port: ServicePort) -> cluster_pb2.Cluster:
    """A service-entry host: DNS-resolved, static endpoints over EDS, or the original destination."""
    if view.resolution in ("DNS", "DNS_ROUND_ROBIN"):
        kind = cluster_pb2.Cluster.STRICT_DNS if view.resolution == "DNS" else cluster_pb2.Cluster.LOGICAL_DNS
        cluster = _base(name, kind, port)
        cluster.lb_policy = cluster_pb2.Cluster.LEAST_REQUEST
        cluster.dns_lookup_family = cluster_pb2.Cluster.V4_ONLY
        cluster.respect_dns_ttl = True
        cluster.load_assignment.CopyFrom(endpoint_pb2.ClusterLoadAssignment(cluster_name=name, endpoints=[
            endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=[endpoint_components_pb2.LbEndpoint(
                endpoint=endpoint_components_pb2.Endpoint(address=socket_address(view.hostname, port.target_port)),
                load_balancing_weight={"value": 1})], load_balancing_weight={"value": 1})]))
    elif view.resolution == "STATIC":
        cluster = _base(name, cluster_pb2.Cluster.EDS, port)
        cluster.lb_policy = cluster_pb2.Cluster.LEAST_REQUEST
        cluster.eds_cluster_config.CopyFrom(cluster_pb2.Cluster.EdsClusterConfig(
            service_name=name, eds_config=ads_config_source()))
    else:
        cluster = _base(name, cluster_pb2.Cluster.ORIGINAL_DST, port)
        cluster.lb_policy = cluster_pb2.Cluster.CLUSTER_PROVIDED
    md = _service_metadata(view)
    md.filter_metadata["istio"].update({"external": True})
    cluster.metadata.CopyFrom(md)
    return cluster


def inbound_cluster(ctx: ProxyContext, view: ServiceView, port: ServicePort) -> cluster_pb2.Cluster:
    name = inbound_cluster_name(port.target_port)
    localhost = ctx.snapshot.registry.inbound_traffic_policy == "LOCALHOST"
    cluster = _base(name, cluster_pb2.Cluster.STATIC if localhost else cluster_pb2.Cluster.ORIGINAL_DST, port)
    if localhost:
        cluster.load_assignment.CopyFrom(endpoint_pb2.ClusterLoadAssignment(cluster_name=name, endpoints=[
            endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=[endpoint_components_pb2.LbEndpoint(
                endpoint=endpoint_components_pb2.Endpoint(address=socket_address("127.0.0.1", port.target_port)))])]))
    else:
        cluster.lb_policy = cluster_pb2.Cluster.CLUSTER_PROVIDED
        cluster.cleanup_interval.CopyFrom(duration(MAX_DURATION_SECONDS))
        cluster.upstream_bind_config.CopyFrom(address_pb2.BindConfig(
            source_address=address_pb2.SocketAddress(address=INBOUND_PASSTHROUGH_BIND_IPV4, port_value=0)))
    cluster.metadata.CopyFrom(_service_metadata(view))
    return cluster


def _passthrough(name: str, bind: bool) -> cluster_pb2.Cluster:
    cluster = cluster_pb2.Cluster(
        name=name, type=cluster_pb2.Cluster.ORIGINAL_DST, connect_timeout=duration(CONNECT_TIMEOUT_SECONDS),
        lb_policy=cluster_pb2.Cluster.CLUSTER_PROVIDED, circuit_breakers=_circuit_breakers(),
        alt_stat_name=delimited(name),
    )
    options = http_protocol_options_pb2.HttpProtocolOptions(
        common_http_protocol_options=protocol_pb2.HttpProtocolOptions(idle_timeout=duration(300)),
        use_downstream_protocol_config=http_protocol_options_pb2.HttpProtocolOptions.UseDownstreamHttpConfig(
            http_protocol_options=protocol_pb2.Http1ProtocolOptions(),
            http2_protocol_options=protocol_pb2.Http2ProtocolOptions()),
    )
    cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS_KEY].CopyFrom(pack(options))
    if bind:
        cluster.upstream_bind_config.CopyFrom(address_pb2.BindConfig(
            source_address=address_pb2.SocketAddress(address=INBOUND_PASSTHROUGH_BIND_IPV4, port_value=0)))
    return cluster


def special_clusters() -> list[cluster_pb2.Cluster]:
    blackhole = cluster_pb2.Cluster(
        name=BLACKHOLE_CLUSTER, type=cluster_pb2.Cluster.STATIC, connect_timeout=duration(CONNECT_TIMEOUT_SECONDS),
        lb_policy=cluster_pb2.Cluster.ROUND_ROBIN, alt_stat_name=delimited(BLACKHOLE_CLUSTER))
    return [blackhole, _passthrough(PASSTHROUGH_CLUSTER, bind=False),
            _passthrough(INBOUND_PASSTHROUGH_CLUSTER, bind=True)]


def shared_outbound_clusters(snapshot: MeshSnapshot) -> Resources:
    """Clusters every sidecar gets (outbound and special): built once per snapshot."""
    cached = snapshot.memo.get("cds")
    if cached is None:
        cached = {}
        for view in snapshot.services:
            for port in view.ports:
                cluster = outbound_cluster(snapshot, view, port)
                cached[cluster.name] = pack(cluster)
        for cluster in special_clusters():
            cached[cluster.name] = pack(cluster)
        snapshot.memo["cds"] = cached
    return cached


def build_clusters(ctx: ProxyContext) -> Resources:
    out = dict(shared_outbound_clusters(ctx.snapshot))
    for target in ctx.inbound:
        cluster = inbound_cluster(ctx, target.service, target.port)
        out[cluster.name] = pack(cluster)
    return out

