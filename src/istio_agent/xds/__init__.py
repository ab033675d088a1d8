"""The XDS proxy between Envoy and istiod (ADS on `<configPath>/XDS`, raw-bytes relay).

Public API: `XdsProxy(options)` with `start()` / `stop()` / `set_health()`, and
`XdsProxyOptions` (`from_config(agent_config, ...)` for the agent).
"""

from istio_agent.xds.options import XdsProxyOptions
from istio_agent.xds.proxy import ProxyStats, XdsProxy
from istio_agent.xds.upstream import UpstreamSettings

__all__ = ["ProxyStats", "UpstreamSettings", "XdsProxy", "XdsProxyOptions"]
