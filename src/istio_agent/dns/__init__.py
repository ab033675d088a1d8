"""The agent's DNS proxy: NameTable hosts answered locally, everything else forwarded.

Public API: `DnsProxy` + `DnsProxyOptions` (the component), `port53_rules`
(upstream's special case for an address on port 53), `name_table_json` (the
/debug/ndsz view). The sans-IO core lives in `table` (upstream's naming
rules), `answers` (pre-packed wire answers), `responder` (per-packet decision)
and `wire` (message validation, truncation).
"""

from istio_agent.dns.ndsz import name_table_json
from istio_agent.dns.server import DnsProxy, DnsProxyOptions, port53_rules

__all__ = ["DnsProxy", "DnsProxyOptions", "name_table_json", "port53_rules"]
