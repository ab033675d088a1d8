"""Bootstrap parts only Istio's own Envoy build (istio-proxy) registers, and how to run without them.

Upstream's bootstrap is written for istio-proxy. Two of its parts are unknown to
a stock Envoy, which refuses the whole file: the `metadata_discovery` bootstrap
extension (peer metadata over xDS, for waypoints and ambient) and the Lightstep
tracer (removed from Envoy upstream). The supervisor asks the Envoy it will run
(`--mode validate`) only when one of these is present; when that Envoy names one
of them as unregistered, that part is left out, with a warning saying what is lost.
Everything else about the bootstrap, and istio-proxy itself, is untouched.

Pure functions over the bootstrap dict and Envoy's output; the I/O is the supervisor's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# Type URL (without the type.googleapis.com/ prefix) → what running without it loses.
ISTIO_PROXY_ONLY_TYPES: dict[str, str] = {
    "istio.workload.BootstrapExtension": "peer metadata discovery (metadata_discovery)",
    "envoy.config.trace.v3.LightstepConfig": "the Lightstep tracer",
}

_UNREGISTERED = re.compile(r"Didn't find a registered implementation for '[^']*' with type URL: '([^']+)'")


def _type_url(typed_config: Any) -> str:
    """The inner type of a typed config (a TypedStruct's `type_url`, else its `@type`), without the prefix."""
    if not isinstance(typed_config, dict):
        return ""
    url = str(typed_config.get("type_url") or typed_config.get("@type") or "")
    return url.rsplit("/", 1)[-1]


def _tracer_type(bootstrap: dict[str, Any]) -> str:
    tracing = bootstrap.get("tracing")
    http = tracing.get("http") if isinstance(tracing, dict) else None
    return _type_url(http.get("typed_config")) if isinstance(http, dict) else ""


def istio_proxy_only_types(bootstrap: dict[str, Any]) -> set[str]:
    """The istio-proxy-only types this bootstrap uses."""
    found = {_type_url(extension.get("typed_config")) for extension in bootstrap.get("bootstrap_extensions") or []
             if isinstance(extension, dict)}
    found.add(_tracer_type(bootstrap))
    return found & ISTIO_PROXY_ONLY_TYPES.keys()


def unregistered_type(validation_output: str) -> str:
    """The type Envoy's `--mode validate` says it has no implementation for; "" when it says nothing of the kind."""
    match = _UNREGISTERED.search(validation_output)
    return match.group(1).rsplit("/", 1)[-1] if match else ""


def without_types(bootstrap: dict[str, Any], types: Iterable[str]) -> dict[str, Any]:
    """`bootstrap` without the bootstrap extensions and server-wide tracer of `types` (a new dict)."""
    drop = set(types)
    out = dict(bootstrap)
    if "bootstrap_extensions" in out:
        out["bootstrap_extensions"] = [
            extension for extension in out["bootstrap_extensions"]
            if not (isinstance(extension, dict) and _type_url(extension.get("typed_config")) in drop)]
    if _tracer_type(out) in drop:
        del out["tracing"]
    return out
