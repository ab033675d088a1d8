"""CDS and RDS for proxyless gRPC: one EDS cluster and one route configuration per service port.

Both are named by the cluster key `outbound|<port>||<host>` (upstream names
the route after the cluster too). A cluster reads its endpoints over ADS
and carries the mTLS transport socket when the destination's servers
demand mTLS (`grpc_tls.client_uses_mtls`). The route configuration holds one
virtual host whose domains are every authority a client may have dialled:
gRPC matches the target's host *with* its port, so each name (FQDN, the
short forms of the proxy's namespace, the VIPs) appears bare and as
`<name>:<port>`.

Only names of known service ports are answered; anything else is absent,
which gRPC reports as "resource does not exist".
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import config_source_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2

from istio_agent.netaddr import join_host_port
from istiod_local.controlplane.xds.generators import grpc_tls, tls
from istiod_local.controlplane.xds.generators.base import ProxyContext, Resources
from istiod_local.controlplane.xds.generators.envoy import duration, outbound_cluster_name, pack
from istiod_local.controlplane.xds.generators.grpc_names import parse_cluster_key
from istiod_local.controlplane.xds.generators.routes import alt_hosts, service_addresses
from istiod_local.controlplane.xds.mesh import MeshSnapshot, ServiceView
from istiod_local.controlplane.xds.registry import ServicePort


def ads_source() -> config_source_pb2.ConfigSource:
    """gRPC accepts only `ads` (or `self`) as a config source."""
    return config_source_pb2.ConfigSource(ads=config_source_pb2.AggregatedConfigSource())


def service_ports(snapshot: MeshSnapshot) -> Iterator[tuple[ServiceView, ServicePort]]:
    for view in snapshot.services:
        for port in view.ports:
            yield view, port


def lookup(snapshot: MeshSnapshot, name: str) -> tuple[ServiceView, ServicePort] | None:
    """The service port behind a default-subset outbound cluster key."""
    key = parse_cluster_key(name)
    if key is None or key.direction != "outbound" or key.subset:
        return None
    view = snapshot.service(key.hostname)
    port = view.port(key.port) if view else None
    return (view, port) if view and port else None


def eds_cluster(snapshot: MeshSnapshot, view: ServiceView, port: ServicePort) -> cluster_pb2.Cluster:
    name = outbound_cluster_name(port.port, view.hostname)
    cluster = cluster_pb2.Cluster(
        name=name, type=cluster_pb2.Cluster.EDS,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(service_name=name, eds_config=ads_source()),
    )
    if grpc_tls.client_uses_mtls(snapshot, view):
        context = grpc_tls.upstream_mtls(snapshot.service_accounts(view))
        cluster.transport_socket.CopyFrom(tls.tls_transport_socket(context))
    return cluster


def _wanted(snapshot: MeshSnapshot, names: Collection[str] | None) -> list[tuple[str, ServiceView, ServicePort]]:
    if names is None:
        return [(outbound_cluster_name(p.port, v.hostname), v, p) for v, p in service_ports(snapshot)]
    out = []
    for name in sorted(set(names)):
        found = lookup(snapshot, name)
        if found is not None:
            out.append((name, *found))
    return out


def build_clusters(ctx: ProxyContext, names: Collection[str] | None) -> Resources:
    """Clusters depend on the snapshot only, so each is built once per snapshot and shared by every proxy."""
    snapshot = ctx.snapshot
    cache: Resources = snapshot.memo.setdefault(("grpc", "cds"), {})
    out: Resources = {}
    for name, view, port in _wanted(snapshot, names):
        if name not in cache:
            cache[name] = pack(eds_cluster(snapshot, view, port))
        out[name] = cache[name]
    return out


def virtual_host_domains(ctx: ProxyContext, view: ServiceView, port: ServicePort) -> list[str]:
    names = [view.hostname, *alt_hosts(view, ctx.proxy.dns_domain),
             *service_addresses(view, ctx.proxy, ctx.snapshot)]
    domains: list[str] = []
    for name in dict.fromkeys(names):
        domains += [name, join_host_port(name, port.port)]
    return domains


def route_configuration(ctx: ProxyContext, name: str, view: ServiceView,
                        port: ServicePort) -> route_pb2.RouteConfiguration:
    cluster = outbound_cluster_name(port.port, view.hostname)
    action = route_components_pb2.RouteAction(
        cluster=cluster, timeout=duration(0),
        max_stream_duration=route_components_pb2.RouteAction.MaxStreamDuration(
            max_stream_duration=duration(0), grpc_timeout_header_max=duration(0)),
    )
    vhost = route_components_pb2.VirtualHost(
        name=join_host_port(view.hostname, port.port),
        domains=virtual_host_domains(ctx, view, port),
        routes=[route_components_pb2.Route(name="default", match=route_components_pb2.RouteMatch(prefix="/"),
                                           route=action)],
    )
    return route_pb2.RouteConfiguration(name=name, virtual_hosts=[vhost])


def build_routes(ctx: ProxyContext, names: Collection[str] | None) -> Resources:
    """Routes depend on the proxy only through its DNS domain and VIP allocation: shared per snapshot on those."""
    proxy = ctx.proxy
    cache: Resources = ctx.snapshot.memo.setdefault(("grpc", "rds", proxy.dns_domain, proxy.dns_auto_allocate), {})
    out: Resources = {}
    for name, view, port in _wanted(ctx.snapshot, names):
        if name not in cache:
            cache[name] = pack(route_configuration(ctx, name, view, port))
        out[name] = cache[name]
    return out
