"""LDS for proxyless gRPC: API listeners for the client side, server listeners for `xds=True` servers.

Client side: a listener named as the client asked (`<host>:<port>`) whose
`api_listener` is an HTTP connection manager with the fault and router
filters and RDS over ADS for `outbound|<port>||<fqdn>`; its address is the
service VIP (gRPC does not use it).

Server side: `xds.istio.io/grpc/lds/inbound/<ip>:<port>` for a port the
proxy's workload serves, bound to that address, with one filter chain and no
listener filters (gRPC NACKs `use_original_dst` and listener filters). The
chain has no match (gRPC cannot sniff TLS, see `grpc_tls`): `inbound-mtls`
requires a client certificate, `inbound-plaintext` takes anything. Its HTTP
connection manager carries the route inline, a catch-all with
`non_forwarding_action` (the server itself handles the call), and the router.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from envoy.config.listener.v3 import api_listener_pb2, listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2

from istio_agent.netaddr import join_host_port
from istiod_local.controlplane.xds.generators import grpc_tls, tls
from istiod_local.controlplane.xds.generators.base import ProxyContext, Resources
from istiod_local.controlplane.xds.generators.envoy import outbound_cluster_name, pack, socket_address
from istiod_local.controlplane.xds.generators.grpc_clusters import ads_source
from istiod_local.controlplane.xds.generators.grpc_names import (
    HostRequest,
    ListenerRequests,
    listener_requests,
    parse_server_listener,
)
from istiod_local.controlplane.xds.generators.routes import service_addresses
from istiod_local.controlplane.xds.mesh import InboundTarget, ServiceView

log = logging.getLogger("istiod_local.controlplane.grpcgen")

FAULT_FILTER = "envoy.filters.http.fault"
ROUTER_FILTER = "envoy.filters.http.router"
INBOUND_ROUTE = "inbound"
WILDCARD_ADDRESS = "0.0.0.0"


def _router() -> hcm_pb2.HttpFilter:
    return hcm_pb2.HttpFilter(name=ROUTER_FILTER, typed_config=pack(router_pb2.Router()))


def client_hcm(route_name: str) -> hcm_pb2.HttpConnectionManager:
    return hcm_pb2.HttpConnectionManager(
        http_filters=[hcm_pb2.HttpFilter(name=FAULT_FILTER, typed_config=pack(fault_pb2.HTTPFault())), _router()],
        rds=hcm_pb2.Rds(config_source=ads_source(), route_config_name=route_name),
    )


def api_listener(name: str, view: ServiceView, port: int, address: str) -> listener_pb2.Listener:
    hcm = client_hcm(outbound_cluster_name(port, view.hostname))
    return listener_pb2.Listener(name=name, address=socket_address(address, port),
                                 api_listener=api_listener_pb2.ApiListener(api_listener=pack(hcm)))


def _client_listeners(ctx: ProxyContext, view: ServiceView, request: HostRequest) -> Resources:
    addresses = service_addresses(view, ctx.proxy, ctx.snapshot)
    address = addresses[0] if addresses else WILDCARD_ADDRESS
    # A listener depends on the proxy only through which service a short name means and the VIP it sees.
    cache: dict[tuple[str, str, str], Any] = ctx.snapshot.memo.setdefault(("grpc", "lds"), {})
    out: Resources = {}
    for spelling in sorted(request.spellings):
        ports = request.spellings[spelling]
        for port in view.ports:
            if ports is None or port.port in ports:
                name = join_host_port(spelling, port.port)
                key = (name, view.hostname, address)
                if key not in cache:
                    cache[key] = pack(api_listener(name, view, port.port, address))
                out[name] = cache[key]
    return out


def outbound_listeners(ctx: ProxyContext, requests: ListenerRequests | None) -> Resources:
    """The requested client listeners; every service's `<fqdn>:<port>` for a wildcard request (None)."""
    out: Resources = {}
    if requests is None:
        for view in ctx.snapshot.services:
            out.update(_client_listeners(ctx, view, HostRequest({view.hostname: None})))
        return out
    for hostname, request in requests.outbound.items():
        found = ctx.snapshot.service(hostname)
        if found is not None:
            out.update(_client_listeners(ctx, found, request))
    return out


def inbound_hcm(port: int) -> hcm_pb2.HttpConnectionManager:
    route = route_pb2.RouteConfiguration(name=INBOUND_ROUTE, virtual_hosts=[route_components_pb2.VirtualHost(
        name=f"inbound|http|{port}", domains=["*"],
        routes=[route_components_pb2.Route(match=route_components_pb2.RouteMatch(prefix="/"),
                                           non_forwarding_action=route_components_pb2.NonForwardingAction())],
    )])
    # Authorization (RBAC filters) would go before the router; the registry has no policies yet.
    return hcm_pb2.HttpConnectionManager(route_config=route, http_filters=[_router()])


def inbound_filter_chain(port: int, mode: str) -> listener_components_pb2.FilterChain:
    suffix = "mtls" if mode == grpc_tls.STRICT else "plaintext"
    hcm = inbound_hcm(port)
    chain = listener_components_pb2.FilterChain(
        name=f"inbound-{suffix}",
        filters=[listener_components_pb2.Filter(name=f"inbound-hcm{suffix}", typed_config=pack(hcm))],
    )
    if mode == grpc_tls.STRICT:
        chain.transport_socket.CopyFrom(tls.tls_transport_socket(grpc_tls.downstream_mtls()))
    return chain


def server_listener(name: str, host: str, target: InboundTarget, mode: str) -> listener_pb2.Listener:
    return listener_pb2.Listener(
        name=name, address=socket_address(host, target.port.target_port),
        filter_chains=[inbound_filter_chain(target.port.target_port, mode)],
    )


def inbound_listeners(ctx: ProxyContext, names: Collection[str]) -> Resources:
    """Server listeners for the requested addresses whose port the proxy's workload serves."""
    if not names:
        return {}
    labels = {**(ctx.workload.labels if ctx.workload else {}), **ctx.proxy.labels}
    mode = grpc_tls.server_mode(ctx.snapshot.registry, ctx.proxy.namespace, labels)
    by_port = {target.port.target_port: target for target in ctx.inbound}
    out: Resources = {}
    for name in sorted(set(names)):
        address = parse_server_listener(name)
        if address is None:
            continue
        host, port = address
        target = by_port.get(port)
        if target is None:
            log.warning("grpc: %s serves no service on port %d (asked for %s)", ctx.proxy.id, port, name)
            continue
        out[name] = pack(server_listener(name, host, target, mode))
    return out


def build_listeners(ctx: ProxyContext, names: Collection[str] | None) -> Resources:
    if names is None:
        return outbound_listeners(ctx, None)
    requests = listener_requests(names, ctx.proxy)
    return {**outbound_listeners(ctx, requests), **inbound_listeners(ctx, requests.inbound)}
