"""Resource names a proxyless gRPC client asks for, and what they mean.

gRPC never subscribes by wildcard: it names exactly what it needs, derived
from what the application dialled.

* Client LDS: the target of `xds:///<host>[:<port>]`, verbatim. The host may
  be a service's FQDN or a short form; upstream expands a short form only
  through the proxy's own DNS domain (`<ns>.svc.<suffix>`): `name`,
  `name.<ns>` and `name.<ns>.svc` for the proxy's namespace. The listener
  is sent under the name that was asked for (gRPC matches it exactly), once
  per port when the name carried none.
* Server LDS: `xds.istio.io/grpc/lds/inbound/<ip>:<port>` (the bootstrap's
  `server_listener_resource_name_template` with the address the server
  binds), answered from the service ports the proxy's own workload serves.
* RDS, CDS and EDS: the cluster key `outbound|<port>|<subset>|<host>`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from istio_agent.netaddr import split_host_optional_port
from istiod_local.controlplane.xds.proxy import Proxy

SERVER_LISTENER_PREFIX = "xds.istio.io/grpc/lds/inbound/"


def expand_short_name(name: str, proxy: Proxy) -> str:
    """The FQDN a short service name stands for, seen from `proxy`; "" when it is not a short form."""
    domain = proxy.dns_domain
    if "." not in name:
        return f"{name}.{domain}"
    for suffix in (proxy.namespace, f"{proxy.namespace}.svc"):
        if name.endswith("." + suffix) and domain.startswith(suffix):
            return f"{name[:-len(suffix) - 1]}.{domain}"
    return ""


@dataclass
class HostRequest:
    """What was asked for one service host: each requested spelling and its ports (None: every port)."""

    spellings: dict[str, set[int] | None] = field(default_factory=dict)

    def add(self, spelling: str, port: int | None) -> None:
        if port is None or self.spellings.get(spelling, set()) is None:
            self.spellings[spelling] = None
            return
        ports = self.spellings.setdefault(spelling, set())
        assert ports is not None
        ports.add(port)


@dataclass(frozen=True)
class ListenerRequests:
    """Requested LDS names, split into client (by service hostname) and server listener names."""

    outbound: dict[str, HostRequest]
    inbound: tuple[str, ...]


def listener_requests(names: Iterable[str], proxy: Proxy) -> ListenerRequests:
    outbound: dict[str, HostRequest] = {}
    inbound: list[str] = []
    for name in names:
        if name.startswith(SERVER_LISTENER_PREFIX):
            inbound.append(name)
            continue
        host, port = split_host_optional_port(name)
        for candidate in dict.fromkeys([host, expand_short_name(host, proxy)]):
            if candidate:
                outbound.setdefault(candidate, HostRequest()).add(host, port)
    return ListenerRequests(outbound, tuple(sorted(inbound)))


@dataclass(frozen=True)
class ClusterKey:
    direction: str
    subset: str
    hostname: str
    port: int

    def __str__(self) -> str:
        return f"{self.direction}|{self.port}|{self.subset}|{self.hostname}"


def parse_cluster_key(name: str) -> ClusterKey | None:
    """`outbound|<port>|<subset>|<host>` (also used as the route name); None when it is not one."""
    parts = name.split("|")
    if len(parts) != 4 or parts[0] not in ("outbound", "inbound") or not parts[1].isdigit() or not parts[3]:
        return None
    return ClusterKey(parts[0], parts[2], parts[3], int(parts[1]))


def parse_server_listener(name: str) -> tuple[str, int] | None:
    """The address a server listener name is for; None when it does not carry `<ip>:<port>`."""
    if not name.startswith(SERVER_LISTENER_PREFIX):
        return None
    host, port = split_host_optional_port(name[len(SERVER_LISTENER_PREFIX):])
    return (host, port) if port else None
