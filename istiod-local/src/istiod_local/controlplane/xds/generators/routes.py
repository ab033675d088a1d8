"""RDS for sidecars: one RouteConfiguration per outbound HTTP port, named by the port ("80").

Each service on the port is a virtual host `<host>:<port>` whose domains are
every name a client in the proxy's namespace may use for it (upstream's
`generateVirtualHostDomains`): the FQDN, the short forms for Kubernetes
services (`echo`, `echo.default`, `echo.default.svc` for the same namespace;
`echo.default`, `echo.default.svc` otherwise) and the VIPs. The route
ignores the port in the Host header (`ignore_port_in_host_matching`), and an
`allow_any` virtual host sends unknown hosts to the PassthroughCluster.
"""

from __future__ import annotations

from collections.abc import Collection

from envoy.config.route.v3 import route_components_pb2, route_pb2

from istiod_local.controlplane.xds.generators.base import ProxyContext, Resources
from istiod_local.controlplane.xds.generators.envoy import (
    INBOUND_PASSTHROUGH_CLUSTER,
    PASSTHROUGH_CLUSTER,
    boolean,
    duration,
    inbound_cluster_name,
    outbound_cluster_name,
    pack,
    uint32,
)
from istiod_local.controlplane.xds.mesh import KUBERNETES, MeshSnapshot, ServiceView
from istiod_local.controlplane.xds.proxy import Proxy
from istiod_local.controlplane.xds.registry import ServicePort

MAX_DIRECT_RESPONSE_BODY_BYTES = 1024 * 1024
ALLOW_ANY = "allow_any"


def service_addresses(view: ServiceView, proxy: Proxy, snapshot: MeshSnapshot) -> tuple[str, ...]:
    """The VIPs a proxy sees for a service: its addresses, or the auto-allocated one if the proxy asked."""
    if view.addresses:
        return view.addresses
    if proxy.dns_auto_allocate and view.hostname in snapshot.registry.auto_vips:
        return (snapshot.registry.auto_vips[view.hostname],)
    return ()


def alt_hosts(view: ServiceView, dns_domain: str) -> list[str]:
    """Short names of a Kubernetes service as seen from the proxy's DNS domain (`<ns>.svc.<suffix>`)."""
    if view.registry != KUBERNETES or ".svc." not in dns_domain:
        return []
    proxy_ns = dns_domain.split(".svc.", 1)[0]
    base = f"{view.name}.{view.namespace}"
    if view.namespace == proxy_ns:
        return [view.name, f"{base}.svc", base]
    return [base, f"{base}.svc"]


def _route_action(cluster: str) -> route_components_pb2.RouteAction:
    return route_components_pb2.RouteAction(
        cluster=cluster, timeout=duration(0),
        max_stream_duration=route_components_pb2.RouteAction.MaxStreamDuration(
            max_stream_duration=duration(0), grpc_timeout_header_max=duration(0)),
    )


def _virtual_host(ctx: ProxyContext, view: ServiceView, port: ServicePort) -> route_components_pb2.VirtualHost:
    domains = [view.hostname, *alt_hosts(view, ctx.proxy.dns_domain),
               *service_addresses(view, ctx.proxy, ctx.snapshot)]
    cluster = outbound_cluster_name(port.port, view.hostname)
    return route_components_pb2.VirtualHost(
        name=f"{view.hostname}:{port.port}",
        domains=list(dict.fromkeys(domains)),
        routes=[route_components_pb2.Route(
            name="default",
            match=route_components_pb2.RouteMatch(prefix="/"),
            route=_route_action(cluster),
            decorator=route_components_pb2.Decorator(operation=f"{view.hostname}:{port.port}/*"),
        )],
        include_request_attempt_count=True,
    )


def _allow_any() -> route_components_pb2.VirtualHost:
    action = route_components_pb2.RouteAction(cluster=PASSTHROUGH_CLUSTER, timeout=duration(0),
                                              max_grpc_timeout=duration(0))
    return route_components_pb2.VirtualHost(
        name=ALLOW_ANY, domains=["*"], include_request_attempt_count=True,
        routes=[route_components_pb2.Route(name=ALLOW_ANY, match=route_components_pb2.RouteMatch(prefix="/"),
                                           route=action)],
    )


def http_ports(snapshot: MeshSnapshot) -> list[int]:
    """Ports that carry HTTP for some service: each gets a `0.0.0.0_<port>` listener and route `<port>`."""
    return sorted({p.port for view in snapshot.services for p in view.ports if p.is_http})


def outbound_route(ctx: ProxyContext, port_number: int) -> route_pb2.RouteConfiguration:
    hosts: list[route_components_pb2.VirtualHost] = []
    seen: set[str] = set()
    for view in ctx.snapshot.services:
        port = view.port(port_number)
        if port is None or not port.is_http:
            continue
        vhost = _virtual_host(ctx, view, port)
        # A domain may appear in only one virtual host; the first service (by hostname) keeps it.
        kept = [d for d in vhost.domains if d.lower() not in seen]
        seen.update(d.lower() for d in kept)
        del vhost.domains[:]
        vhost.domains.extend(kept)
        if kept:
            hosts.append(vhost)
    hosts.append(_allow_any())
    return route_pb2.RouteConfiguration(
        name=str(port_number), virtual_hosts=hosts, validate_clusters=boolean(False),
        max_direct_response_body_size_bytes=uint32(MAX_DIRECT_RESPONSE_BODY_BYTES),
        ignore_port_in_host_matching=True,
    )


def build_routes(ctx: ProxyContext, names: Collection[str] | None) -> Resources:
    """Route configurations by name; only the requested names are built (RDS is never wildcard)."""
    known = {str(p) for p in http_ports(ctx.snapshot)}
    wanted = known if names is None else {n for n in names if n in known}
    # Routes depend on the proxy only through its DNS domain and VIP auto-allocation: share them per snapshot.
    cache = ctx.snapshot.memo.setdefault(("rds", ctx.proxy.dns_domain, ctx.proxy.dns_auto_allocate), {})
    for name in wanted - cache.keys():
        cache[name] = pack(outbound_route(ctx, int(name)))
    return {name: cache[name] for name in sorted(wanted)}


def inbound_route(view: ServiceView, port: ServicePort) -> route_pb2.RouteConfiguration:
    """The inline route of an inbound HTTP chain: everything to `inbound|<targetPort>||`."""
    cluster = inbound_cluster_name(port.target_port)
    route = route_components_pb2.Route(
        name="default", match=route_components_pb2.RouteMatch(prefix="/"), route=_route_action(cluster),
        decorator=route_components_pb2.Decorator(operation=f"{view.hostname}:{port.port}/*"),
    )
    return route_pb2.RouteConfiguration(
        name=cluster, validate_clusters=boolean(False),
        virtual_hosts=[route_components_pb2.VirtualHost(name=f"inbound|http|{port.port}", domains=["*"],
                                                        routes=[route])],
    )


def inbound_passthrough_route() -> route_pb2.RouteConfiguration:
    route = route_components_pb2.Route(
        name="default", match=route_components_pb2.RouteMatch(prefix="/"),
        route=_route_action(INBOUND_PASSTHROUGH_CLUSTER),
        decorator=route_components_pb2.Decorator(operation=":0/*"),
    )
    return route_pb2.RouteConfiguration(
        name=INBOUND_PASSTHROUGH_CLUSTER, validate_clusters=boolean(False),
        virtual_hosts=[route_components_pb2.VirtualHost(name="inbound|http|0", domains=["*"], routes=[route])],
    )
