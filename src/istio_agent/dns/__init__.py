"""The agent's DNS proxy: NameTable hosts answered locally, everything else forwarded.

Public API: `DnsProxy` (the component, in `proxy`), `DnsProxyOptions` and
`port53_rules` (upstream's special case for an address on port 53, in
`options`), `name_table_json` (the /debug/ndsz view, in `core.ndsz`). The
sans-IO core lives in `core/` (`table`, `answers`, `responder`, `wire`,
`tcp_framing`, `tcp_admission`); the I/O edges at the top level: `proxy`
(threads, sockets), `tcp` (DNS over TCP on asyncio), `forward` (the upstream
resolvers) and `metrics`.

`DnsProxy` and `name_table_json` are loaded on first use: importing this
package (as the options resolver does, for `istio_agent.dns.options`) must not
pull in sockets, threads, metrics or protobuf.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from istio_agent.dns.options import DnsProxyOptions, port53_rules

if TYPE_CHECKING:
    from istio_agent.dns.core.ndsz import name_table_json
    from istio_agent.dns.proxy import DnsProxy

__all__ = ["DnsProxy", "DnsProxyOptions", "name_table_json", "port53_rules"]


def __getattr__(name: str) -> Any:
    """Import the heavy public names on first access (PEP 562)."""
    if name == "DnsProxy":
        from istio_agent.dns.proxy import DnsProxy

        return DnsProxy
    if name == "name_table_json":
        from istio_agent.dns.core.ndsz import name_table_json

        return name_table_json
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
