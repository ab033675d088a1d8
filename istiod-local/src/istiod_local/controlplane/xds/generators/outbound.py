"""Outbound LDS for sidecars: `virtualOutbound` on 15001 and the per-port listeners it hands off to.

iptables redirects the app's connections to 15001; `virtualOutbound` uses
the original destination to hand each connection to the listener bound
(virtually, `bind_to_port: false`) to that address:port, as upstream does:

* `0.0.0.0_<port>` for every port where some service speaks HTTP: an HTTP
  connection manager with RDS route `<port>`, which picks the service by Host;
* `<vip>_<port>` for TCP service ports: a TCP proxy to `outbound|<port>||<host>`.

Anything else stays on `virtualOutbound` and goes to the PassthroughCluster;
a connection addressed to 15001 itself is black-holed (no loops).
"""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

from istiod_local.controlplane.xds.generators.base import ProxyContext
from istiod_local.controlplane.xds.generators.envoy import (
    BLACKHOLE_CLUSTER,
    PASSTHROUGH_CLUSTER,
    boolean,
    delimited,
    duration,
    listener_name,
    outbound_cluster_name,
    pack,
    socket_address,
    uint32,
)
from istiod_local.controlplane.xds.generators.http import hcm_filter, outbound_hcm
from istiod_local.controlplane.xds.generators.routes import http_ports, service_addresses

VIRTUAL_OUTBOUND = "virtualOutbound"
VIRTUAL_OUTBOUND_PORT = 15001
VIRTUAL_INBOUND_PORT = 15006
TCP_PROXY_FILTER = "envoy.filters.network.tcp_proxy"
WILDCARD = "0.0.0.0"
# Ports of the sidecar itself; a service on one of them gets no outbound listener (as upstream's CanBindToPort).
RESERVED_PORTS = frozenset({15000, 15001, 15004, 15006, 15008, 15020, 15021, 15053, 15090})
TRANSPORT_SOCKET_CONNECT_TIMEOUT = 15.0


def tcp_proxy_filter(cluster: str, stat_prefix: str | None = None) -> listener_components_pb2.Filter:
    proxy = tcp_proxy_pb2.TcpProxy(stat_prefix=stat_prefix or cluster, cluster=cluster)
    return listener_components_pb2.Filter(name=TCP_PROXY_FILTER, typed_config=pack(proxy))


def virtual_outbound() -> listener_pb2.Listener:
    return listener_pb2.Listener(
        name=VIRTUAL_OUTBOUND,
        address=socket_address(WILDCARD, VIRTUAL_OUTBOUND_PORT),
        use_original_dst=boolean(True),
        traffic_direction=base_pb2.OUTBOUND,
        filter_chains=[
            listener_components_pb2.FilterChain(
                name="virtualOutbound-blackhole",
                filter_chain_match=listener_components_pb2.FilterChainMatch(
                    destination_port=uint32(VIRTUAL_OUTBOUND_PORT)),
                filters=[tcp_proxy_filter(BLACKHOLE_CLUSTER)],
            ),
            listener_components_pb2.FilterChain(
                name="virtualOutbound-catchall-tcp", filters=[tcp_proxy_filter(PASSTHROUGH_CLUSTER)]),
        ],
    )


def _port_listener(address: str, port: int, chain: listener_components_pb2.FilterChain) -> listener_pb2.Listener:
    chain.transport_socket_connect_timeout.CopyFrom(duration(TRANSPORT_SOCKET_CONNECT_TIMEOUT))
    return listener_pb2.Listener(
        name=listener_name(address, port),
        address=socket_address(address, port),
        bind_to_port=boolean(False),
        traffic_direction=base_pb2.OUTBOUND,
        continue_on_listener_filters_timeout=True,
        listener_filters_timeout=duration(0),
        filter_chains=[chain],
    )


def outbound_listeners(ctx: ProxyContext) -> list[listener_pb2.Listener]:
    out: list[listener_pb2.Listener] = []
    for number in http_ports(ctx.snapshot):
        if number in RESERVED_PORTS:
            continue
        name = listener_name(WILDCARD, number)
        chain = listener_components_pb2.FilterChain(
            filters=[hcm_filter(outbound_hcm(delimited(f"outbound_{name}"), str(number)))])
        out.append(_port_listener(WILDCARD, number, chain))
    seen: set[tuple[str, int]] = set()
    for view in ctx.snapshot.services:
        for port in view.ports:
            if port.is_http or port.port in RESERVED_PORTS:
                continue
            cluster = outbound_cluster_name(port.port, view.hostname)
            for address in service_addresses(view, ctx.proxy, ctx.snapshot):
                if (address, port.port) in seen or ":" in address:
                    continue
                seen.add((address, port.port))
                chain = listener_components_pb2.FilterChain(filters=[tcp_proxy_filter(cluster)])
                out.append(_port_listener(address, port.port, chain))
    out.append(virtual_outbound())
    return out
