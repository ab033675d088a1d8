"""Inbound LDS for sidecars: `virtualInbound` on 15006 with filter chains per served port.

Filter chains follow upstream's match options for the namespace's
PeerAuthentication mode:

* STRICT: only TLS (`transport_protocol: tls`), terminated with mesh mTLS;
* PERMISSIVE: mesh mTLS (TLS + an Istio ALPN) *and* plaintext (`raw_buffer`);
  for TCP ports also foreign TLS, passed through untouched;
* DISABLE: plaintext only.

HTTP ports terminate in an HTTP connection manager that routes to
`inbound|<targetPort>||` and sets `x-forwarded-client-cert` from the peer
certificate; TCP ports proxy straight to the inbound cluster. Unmatched
ports use the passthrough chains (`virtualInbound`,
`virtualInbound-catchall-http`) to the InboundPassthroughCluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.listener.http_inspector.v3 import http_inspector_pb2
from envoy.extensions.filters.listener.original_dst.v3 import original_dst_pb2
from envoy.extensions.filters.listener.tls_inspector.v3 import tls_inspector_pb2
from envoy.type.v3 import range_pb2

from istiod_local.controlplane.xds.generators import tls
from istiod_local.controlplane.xds.generators.base import ProxyContext
from istiod_local.controlplane.xds.generators.envoy import (
    BLACKHOLE_CLUSTER,
    INBOUND_PASSTHROUGH_CLUSTER,
    delimited,
    duration,
    inbound_cluster_name,
    listener_name,
    pack,
    socket_address,
    uint32,
)
from istiod_local.controlplane.xds.generators.http import forward_client_cert, hcm_filter, inbound_hcm
from istiod_local.controlplane.xds.generators.outbound import VIRTUAL_INBOUND_PORT, WILDCARD, tcp_proxy_filter
from istiod_local.controlplane.xds.generators.routes import inbound_passthrough_route, inbound_route

VIRTUAL_INBOUND = "virtualInbound"
CATCHALL_HTTP = "virtualInbound-catchall-http"
BLACKHOLE_CHAIN = "virtualInbound-blackhole"
TLS = "tls"
RAW = "raw_buffer"


@dataclass(frozen=True)
class ChainOption:
    """One filter-chain match: transport, ALPN, HTTP or TCP, and whether to terminate mTLS."""

    http: bool
    transport: str
    alpn: tuple[str, ...] = ()
    terminate_tls: bool = False


def match_options(mode: str, protocol: str) -> list[ChainOption]:
    """Upstream's filter-chain match options for an mTLS mode and a port protocol (HTTP, TCP or AUTO)."""
    http_mtls = ChainOption(True, TLS, tls.ALL_ISTIO_MTLS_ALPNS, True)
    tcp_mtls = ChainOption(False, TLS, tls.ALL_ISTIO_MTLS_ALPNS, True)
    if protocol == "HTTP":
        return {"STRICT": [ChainOption(True, TLS, (), True)],
                "PERMISSIVE": [http_mtls, ChainOption(True, RAW)]}.get(mode, [ChainOption(True, RAW)])
    if protocol == "TCP":
        return {"STRICT": [ChainOption(False, TLS, (), True)],
                "PERMISSIVE": [tcp_mtls, ChainOption(False, RAW), ChainOption(False, TLS)]}.get(
            mode, [ChainOption(False, RAW)])
    # AUTO (the passthrough chains): HTTP and TCP, told apart by ALPN and the HTTP inspector.
    if mode == "STRICT":
        return [ChainOption(True, TLS, tls.MTLS_HTTP_ALPNS, True), ChainOption(False, TLS, (), True)]
    if mode == "PERMISSIVE":
        return [ChainOption(True, TLS, tls.MTLS_HTTP_ALPNS, True), ChainOption(True, RAW, tls.PLAINTEXT_HTTP_ALPNS),
                ChainOption(False, TLS, tls.MTLS_TCP_ALPNS, True), ChainOption(False, RAW), ChainOption(False, TLS)]
    return [ChainOption(True, RAW, tls.PLAINTEXT_HTTP_ALPNS), ChainOption(False, RAW)]


def _chain(name: str, port: int, option: ChainOption,
           filters: Sequence[listener_components_pb2.Filter]) -> listener_components_pb2.FilterChain:
    match = listener_components_pb2.FilterChainMatch(transport_protocol=option.transport,
                                                     application_protocols=list(option.alpn))
    if port:
        match.destination_port.CopyFrom(uint32(port))
    chain = listener_components_pb2.FilterChain(name=name, filter_chain_match=match, filters=list(filters))
    if option.terminate_tls:
        chain.transport_socket.CopyFrom(tls.tls_transport_socket(tls.istio_mutual_downstream(option.http)))
    return chain


def _http_filters(stat_prefix: str, route: route_pb2.RouteConfiguration, http2: bool,
                  ctx: ProxyContext) -> list[listener_components_pb2.Filter]:
    return [hcm_filter(inbound_hcm(stat_prefix, route, http2, forward_client_cert(ctx.proxy.proxy_config)))]


def _blackhole_chain() -> listener_components_pb2.FilterChain:
    return listener_components_pb2.FilterChain(
        name=BLACKHOLE_CHAIN,
        filter_chain_match=listener_components_pb2.FilterChainMatch(destination_port=uint32(VIRTUAL_INBOUND_PORT)),
        filters=[tcp_proxy_filter(BLACKHOLE_CLUSTER)],
    )


def _passthrough_chains(ctx: ProxyContext) -> list[listener_components_pb2.FilterChain]:
    chains = []
    for option in match_options(ctx.mtls_mode, "AUTO"):
        if option.http:
            filters = _http_filters(delimited(INBOUND_PASSTHROUGH_CLUSTER), inbound_passthrough_route(), False, ctx)
            chains.append(_chain(CATCHALL_HTTP, 0, option, filters))
        else:
            chains.append(_chain(VIRTUAL_INBOUND, 0, option, [tcp_proxy_filter(INBOUND_PASSTHROUGH_CLUSTER)]))
    return chains


def _port_chains(ctx: ProxyContext) -> list[listener_components_pb2.FilterChain]:
    chains = []
    for target in ctx.inbound:
        port = target.port
        name = listener_name(WILDCARD, port.target_port)
        cluster = inbound_cluster_name(port.target_port)
        for option in match_options(ctx.mtls_mode, "HTTP" if port.is_http else "TCP"):
            if option.http:
                filters = _http_filters(delimited(f"inbound_{name}"), inbound_route(target.service, port),
                                        port.is_http2, ctx)
            else:
                filters = [tcp_proxy_filter(cluster)]
            chains.append(_chain(name, port.target_port, option, filters))
    return chains


def _exclude_ports(ports: Sequence[int]) -> listener_components_pb2.ListenerFilterChainMatchPredicate:
    """A predicate true for connections to any of `ports` (used to switch an inspector off there)."""
    rules = [listener_components_pb2.ListenerFilterChainMatchPredicate(
        destination_port_range=range_pb2.Int32Range(start=p, end=p + 1)) for p in ports]
    if len(rules) == 1:
        return rules[0]
    return listener_components_pb2.ListenerFilterChainMatchPredicate(
        or_match=listener_components_pb2.ListenerFilterChainMatchPredicate.MatchSet(rules=rules))


def _listener_filters(
    chains: Sequence[listener_components_pb2.FilterChain],
) -> list[listener_components_pb2.ListenerFilter]:
    """original_dst, then the TLS inspector, then the HTTP inspector only where some chain needs it.

    Sniffing HTTP on a declared TCP port would stall server-first protocols, so the
    HTTP inspector is disabled on every port whose chains do not match HTTP ALPNs.
    """
    filters = [listener_components_pb2.ListenerFilter(
        name="envoy.filters.listener.original_dst", typed_config=pack(original_dst_pb2.OriginalDst()))]
    needs_tls = any(c.filter_chain_match.transport_protocol == TLS for c in chains)
    http_ports: dict[int, bool] = {}
    for chain in chains:
        port = chain.filter_chain_match.destination_port.value
        wants = any(a in tls.PLAINTEXT_HTTP_ALPNS for a in chain.filter_chain_match.application_protocols)
        http_ports[port] = http_ports.get(port, False) or wants
    if needs_tls:
        filters.append(listener_components_pb2.ListenerFilter(
            name="envoy.filters.listener.tls_inspector", typed_config=pack(tls_inspector_pb2.TlsInspector())))
    if any(http_ports.values()):
        inspector = listener_components_pb2.ListenerFilter(
            name="envoy.filters.listener.http_inspector", typed_config=pack(http_inspector_pb2.HttpInspector()))
        disabled = sorted(p for p, wants in http_ports.items() if p and not wants)
        if disabled:
            inspector.filter_disabled.CopyFrom(_exclude_ports(disabled))
        filters.append(inspector)
    return filters


def virtual_inbound(ctx: ProxyContext) -> listener_pb2.Listener:
    chains = [_blackhole_chain(), *_passthrough_chains(ctx), *_port_chains(ctx)]
    return listener_pb2.Listener(
        name=VIRTUAL_INBOUND,
        address=socket_address(WILDCARD, VIRTUAL_INBOUND_PORT),
        traffic_direction=base_pb2.INBOUND,
        continue_on_listener_filters_timeout=True,
        listener_filters=_listener_filters(chains),
        listener_filters_timeout=duration(0),
        filter_chains=chains,
    )
