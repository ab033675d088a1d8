"""What the Wasm module cache is (options), resolved once by `agent/options.py` from the WASM_* variables.

Light on purpose (resolution happens before anything starts): plain values only; the fetchers, the cache and
Envoy's Wasm protos load on the first extension config that carries a remote module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path

# Upstream's defaults (pkg/wasm/options.go, pilot features).
DEFAULT_PURGE_INTERVAL = 3600.0
DEFAULT_MODULE_EXPIRY = 24 * 3600.0
DEFAULT_HTTP_REQUEST_TIMEOUT = 15.0
DEFAULT_HTTP_REQUEST_MAX_RETRIES = 5
DEFAULT_MAX_MODULE_SIZE = 256 * 1024 * 1024
DEFAULT_MAX_CACHE_BYTES = 1024 * 1024 * 1024
# Upstream's cache directory (constants.IstioDataDir); Envoy reads the modules from here.
DEFAULT_CACHE_DIR = "/var/lib/istio/data"


@dataclass(frozen=True)
class WasmOptions:
    """The Wasm cache and fetchers of one agent; `enabled` False forwards ECDS untouched, as upstream's switch."""

    cache_dir: Path
    enabled: bool = True
    purge_interval: float = DEFAULT_PURGE_INTERVAL
    module_expiry: float = DEFAULT_MODULE_EXPIRY
    # Hosts (host or host:port as in the URL) fetched without TLS verification; "*" is every host.
    insecure_registries: frozenset[str] = frozenset()
    http_request_timeout: float = DEFAULT_HTTP_REQUEST_TIMEOUT
    http_request_max_retries: int = DEFAULT_HTTP_REQUEST_MAX_RETRIES
    blocked_cidrs: tuple[IPv4Network | IPv6Network, ...] = field(default=())
    max_module_size: int = DEFAULT_MAX_MODULE_SIZE
    max_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES

    def allow_insecure(self, host: str) -> bool:
        return "*" in self.insecure_registries or host in self.insecure_registries
