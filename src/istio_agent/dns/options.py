"""The DNS proxy's options and upstream's port-53 rule, importable without the proxy itself.

The agent's options resolver imports this module at start-up, before it knows
whether DNS capture is on, so it must stay light: dataclasses only, no
sockets, threads, metrics or protobuf (a unit test checks what it pulls in).
The proxy (`istio_agent.dns.proxy`) is imported only when the agent runs one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

DEFAULT_ADDR = "localhost:15053"
ALT_RESOLV_CONF = "/var/lib/istio/resolv.conf"


@dataclass(frozen=True, slots=True)
class DnsProxyOptions:
    """Everything the DNS proxy needs, resolved from flags/env by the caller."""

    addr: str = DEFAULT_ADDR  # DNS_PROXY_ADDR; "localhost" binds 127.0.0.1 and ::1 (if available)
    namespace: str = ""  # POD_NAMESPACE: decides which services answer by bare name
    domain: str = ""  # the proxy's --domain, e.g. "default.svc.cluster.local"
    resolv_conf: str = "/etc/resolv.conf"
    upstream_port: int = 53  # resolv.conf cannot carry a port; tests point this at their own server
    forward_parallel: bool = False  # DNS_FORWARD_PARALLEL
    upstream_timeout: float = 5.0
    respond_before_sync: bool = False  # forward instead of SERVFAIL before the first NameTable
    # DNS over TCP. No upstream variable sets these (upstream's server keeps miekg/dns's
    # defaults: 2 s for the first read, 8 s idle); None turns a deadline off.
    tcp_idle_timeout: float = 8.0  # between queries, while nothing is in flight
    # A frame whose first bytes arrived but which is still incomplete this long after (slow senders).
    tcp_partial_frame_timeout: float | None = 3.0
    # From accept to the first complete query: a connection that sends nothing, or drips, is closed.
    tcp_first_query_timeout: float | None = 3.0
    max_tcp_connections: int = 1024  # when full, a newcomer takes the longest-idle connection's slot
    # One client address holds at most this many; its newcomer then takes its own longest-idle one's slot.
    max_tcp_connections_per_source: int = 64
    max_pending_forwards: int = 10_000
    udp_receive_buffer: int = 1 << 20  # absorbs bursts while the GIL is elsewhere (capped by rmem_max)
    use_uvloop: bool = True


def port53_rules(options: DnsProxyOptions, uid: int, alt_resolv_conf_exists: bool) -> DnsProxyOptions:
    """Upstream's special case for an address on port 53 (VMs and Docker, without DNS capture).

    As root: answer (by forwarding) even before the first NameTable, and read
    /var/lib/istio/resolv.conf when it exists (the host's real resolvers, since
    /etc/resolv.conf then points at us). Not root: fall back to localhost:15053.
    """
    if not options.addr.endswith(":53"):
        return options
    if uid != 0:
        return replace(options, addr=DEFAULT_ADDR)
    resolv_conf = ALT_RESOLV_CONF if alt_resolv_conf_exists else options.resolv_conf
    return replace(options, respond_before_sync=True, resolv_conf=resolv_conf)
