"""The XDS proxy between Envoy and istiod (ADS on `<configPath>/XDS`, raw-bytes relay).

Public API: `XdsProxy(options, hooks)` with `start()` / `stop()` / `set_health()`,
`XdsProxyOptions` (built by the options resolver, `agent/options.py`) and
`XdsProxyHooks` (the callbacks the agent's assembly wires). They load on
first use, so that importing a small module of this package (say `core.routing`
or `core.messages`) does not pull in the gRPC server. The sans-IO core is `core/`
(`session`, `messages`, `routing`); the I/O edges (`proxy`, `upstream`) are at
the top level.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "XdsProxyHooks": "istio_agent.xds.options",
    "XdsProxyOptions": "istio_agent.xds.options",
    "ProxyStats": "istio_agent.xds.proxy",
    "XdsProxy": "istio_agent.xds.proxy",
    "UpstreamSettings": "istio_agent.xds.upstream",
}

__all__ = ["ProxyStats", "UpstreamSettings", "XdsProxy", "XdsProxyHooks", "XdsProxyOptions"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
