"""Everything the bootstrap renderer needs, in one value, and how it is derived.

`BootstrapOptions` holds the inputs (node id, ProxyConfig in protojson shape,
node metadata, pod IPs, a few process-wide switches); the options resolver
(`config/options.py`) builds it from the environment, and tests build it
directly. The small pure functions below derive what upstream computes from
it (service cluster, locality, address family, runtime flags, the downstream
connection limit). The renderer and the custom-template parameters both read
these, so the two paths agree.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

FIPS_140_2 = "fips-140-2"
DEFAULT_MAX_DOWNSTREAM_CONNECTIONS = 2147483647
MAX_CONNECTIONS_RUNTIME_KEY = "overload.global_downstream_max_connections"
SDS_SOCKET_DIR = "./var/run/secrets/workload-spiffe-uds"
LIGHTSTEP_TOKEN_FILE = "lightstep_access_token.txt"  # beside the bootstrap, where the tracer reads it


@dataclass(frozen=True)
class BootstrapOptions:
    """The inputs of one bootstrap rendering (`metadata` from `config.node.node_metadata`)."""

    node_id: str
    proxy_config: Mapping[str, Any]
    metadata: Mapping[str, Any]
    instance_ips: tuple[str, ...] = ()
    delta_xds: bool = True
    dual_stack: bool = False
    log_as_json: bool = False
    compliance_policy: str = ""
    strip_fragment: bool = True
    host_ip: str = ""
    deferred_cluster_creation: bool = True
    deferred_stats_creation: bool = True
    bypass_overload_manager: bool = True

    @property
    def config_path(self) -> str:
        return str(self.proxy_config.get("configPath", "./etc/istio/proxy"))

    @property
    def admin_port(self) -> int:
        return int(self.proxy_config.get("proxyAdminPort", 15000))

    @property
    def status_port(self) -> int:
        return int(self.proxy_config.get("statusPort") or 15020)

    @property
    def xds_socket(self) -> str:
        return f"{self.config_path}/XDS"

    @property
    def sds_socket(self) -> str:
        return f"{SDS_SOCKET_DIR}/{self.metadata.get('WORKLOAD_IDENTITY_SOCKET_FILE') or 'socket'}"

    @property
    def lightstep_token_path(self) -> str:
        return f"{self.config_path}/{LIGHTSTEP_TOKEN_FILE}"

    @property
    def annotations(self) -> Mapping[str, str]:
        value = self.metadata.get("ANNOTATIONS")
        return value if isinstance(value, Mapping) else {}

    @property
    def exit_on_zero_active_connections(self) -> bool:
        return self.metadata.get("EXIT_ON_ZERO_ACTIVE_CONNECTIONS") == "true"

    @property
    def xds_type(self) -> str:
        # Waypoints always use delta xDS (metadata discovery needs it).
        return "DELTA_GRPC" if self.delta_xds or self.node_id.startswith("waypoint~") else "GRPC"

    @property
    def metadata_discovery(self) -> bool:
        wanted = self.metadata.get("METADATA_DISCOVERY") == "true" or self.node_id.startswith("waypoint~")
        if wanted and self.xds_type == "GRPC":
            log.warning("metadata discovery needs delta xDS; disabled")
            return False
        return wanted


@dataclass(frozen=True)
class AddressFamily:
    """Loopback, wildcard and DNS family for the pod's IPs (dual stack only when enabled)."""

    localhost: str
    wildcard: str
    dns_lookup_family: str
    additional_localhost: str = ""
    additional_wildcard: str = ""

    @property
    def dual_stack(self) -> bool:
        return bool(self.additional_wildcard)


def address_family(ips: Sequence[str], dual_stack: bool) -> AddressFamily:
    versions: list[int] = []
    for ip in ips:
        try:
            versions.append(ipaddress.ip_address(ip).version)
        except ValueError:
            versions.append(0)
    if all(v == 4 for v in versions):
        return AddressFamily("127.0.0.1", "0.0.0.0", "V4_ONLY")
    if all(v == 6 for v in versions):
        return AddressFamily("::1", "::", "V6_ONLY")
    if not dual_stack:
        return AddressFamily("127.0.0.1", "0.0.0.0", "V4_ONLY")
    if versions and versions[0] == 6:
        return AddressFamily("::1", "::", "ALL", "127.0.0.1", "0.0.0.0")
    return AddressFamily("127.0.0.1", "0.0.0.0", "ALL", "::1", "::")


def locality(metadata: Mapping[str, Any]) -> dict[str, str]:
    """Region/zone/sub-zone from the `istio-locality` label (already `a/b/c` in the metadata)."""
    labels = metadata.get("LABELS")
    text = str(labels.get("istio-locality", "")) if isinstance(labels, Mapping) else ""
    parts = text.split("/") if text else []
    out: dict[str, str] = {}
    for key, value in zip(("region", "zone", "sub_zone"), parts, strict=False):
        if value:
            out[key] = value
    return out


def _canonical_name(labels: Mapping[str, Any], workload_name: str) -> str:
    for key in ("service.istio.io/canonical-name", "app.kubernetes.io/name", "app"):
        if labels.get(key):
            return str(labels[key])
    return workload_name


def service_cluster(proxy_config: Mapping[str, Any], metadata: Mapping[str, Any]) -> str:
    """Envoy's `node.cluster`: the configured name, else `<app>.<namespace>` as upstream derives it."""
    labels = metadata.get("LABELS")
    labels = labels if isinstance(labels, Mapping) else {}
    namespace = str(metadata.get("NAMESPACE", ""))
    workload = str(metadata.get("WORKLOAD_NAME", ""))

    def or_default(name: str) -> str:
        if name and name != "istio-proxy":
            return name
        if "app" in labels:
            return f"{labels['app']}.{namespace}"
        if workload:
            return f"{workload}.{namespace}"
        if namespace:
            return f"istio-proxy.{namespace}"
        return "istio-proxy"

    scheme = proxy_config.get("tracingServiceName")
    if scheme in ("CANONICAL_NAME_ONLY", "CANONICAL_NAME_AND_NAMESPACE") and not proxy_config.get("serviceCluster"):
        name = _canonical_name(labels, workload or "istio-proxy")
        if scheme == "CANONICAL_NAME_AND_NAMESPACE" and namespace:
            return f"{name}.{namespace}"
        return or_default(name)
    return or_default(str(proxy_config.get("serviceCluster", "")))


def runtime_flags(proxy_config: Mapping[str, Any], compliance_policy: str, strip_fragment: bool) -> dict[str, Any]:
    """Envoy runtime overrides: Istio's defaults, then ProxyConfig `runtimeValues` ("" removes a default)."""
    flags: dict[str, Any] = {
        "envoy.deprecated_features:envoy.config.listener.v3.Listener.hidden_envoy_deprecated_use_original_dst": True,
        "envoy.reloadable_features.coalesce_lb_rebuilds_on_batch_update": False,
        "envoy.reloadable_features.fixed_heap_use_allocated": True,
        "envoy.reloadable_features.http_reject_path_with_fragment": False,
        "re2.max_program_size.error_level": "32768",
    }
    if compliance_policy == FIPS_140_2:
        flags["envoy.reloadable_features.google_grpc_disable_tls_13"] = True
    if not strip_fragment:
        flags["envoy.reloadable_features.http_strip_fragment_from_path_unsafe_if_disabled"] = "false"
    for key, value in dict(proxy_config.get("runtimeValues") or {}).items():
        if value == "":
            flags.pop(key, None)
        elif value in ("true", "false"):
            # Envoy stopped accepting "true"/"false" strings for booleans; the API only has strings.
            flags[key] = value == "true"
        else:
            flags[key] = value
    return flags


def max_downstream_connections(proxy_config: Mapping[str, Any], metadata: Mapping[str, Any]) -> int:
    """The overload manager's limit: connectionSettings, then GLOBAL_DOWNSTREAM_MAX_CONNECTIONS, then runtime."""
    settings = proxy_config.get("connectionSettings")
    candidates: list[Any] = []
    if isinstance(settings, Mapping):
        candidates.append(settings.get("globalDownstreamConnectionLimit"))
    candidates.append(metadata.get("GLOBAL_DOWNSTREAM_MAX_CONNECTIONS"))
    candidates.append(dict(proxy_config.get("runtimeValues") or {}).get(MAX_CONNECTIONS_RUNTIME_KEY))
    for candidate in candidates:
        if isinstance(candidate, Mapping):
            candidate = candidate.get("value")
        if candidate in (None, ""):
            continue
        try:
            value = int(str(candidate))
        except ValueError:
            log.warning("ignoring non-numeric downstream connection limit %r", candidate)
            continue
        if value > 0:
            return value
    return DEFAULT_MAX_DOWNSTREAM_CONNECTIONS
