"""Everything the bootstrap renderer needs, in one value, and the small rules upstream derives from it.

`BootstrapOptions` holds the inputs upstream's `bootstrap.Config` has (node id,
the node metadata with its ProxyConfig in protojson shape, the compliance
policy, JSON logging) plus the process-wide feature flags upstream reads from
its environment (delta xDS, dual stack, PROXY protocol on the status port,
`HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED`, `HOST_IP`). The options
resolver (`agent/options.py`) builds it; tests build it directly. The pure
functions below are upstream's rules for the service cluster, the locality, the
address family, the runtime flags and the downstream connection limit;
`values.derive()` applies them once for both rendering paths.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from istio_agent.config.gopath import go_join

log = logging.getLogger(__name__)

FIPS_140_2 = "fips-140-2"
DEFAULT_MAX_DOWNSTREAM_CONNECTIONS = 2147483647  # math.MaxInt32: effectively unlimited
MAX_CONNECTIONS_RUNTIME_KEY = "overload.global_downstream_max_connections"
MAX_CONNECTIONS_PROXY_METADATA = "ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS"
SDS_SOCKET_DIR = "./var/run/secrets/workload-spiffe-uds"
FILE_CREDENTIAL_SOCKET = "./var/run/secrets/credential-uds/files-socket"  # the sds-files-grpc cluster's pipe
LIGHTSTEP_TOKEN_FILE = "lightstep_access_token.txt"  # beside the bootstrap, where the tracer reads it
PROXY_TYPES_WITH_METADATA_DISCOVERY = ("waypoint",)


@dataclass(frozen=True)
class BootstrapOptions:
    """The inputs of one bootstrap rendering (`metadata` from `config.node.node_metadata`)."""

    node_id: str
    proxy_config: Mapping[str, Any]
    metadata: Mapping[str, Any]
    instance_ips: tuple[str, ...] = ()
    delta_xds: bool = True  # ISTIO_DELTA_XDS
    dual_stack: bool = False  # ISTIO_DUAL_STACK
    log_as_json: bool = False
    compliance_policy: str = ""  # COMPLIANCE_POLICY
    strip_fragment: bool = True  # HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED
    host_ip: str = ""  # HOST_IP, replacing $(HOST_IP) in tracer and service addresses
    status_port_proxy_protocol: bool = False  # ENVOY_STATUS_PORT_ENABLE_PROXY_PROTOCOL
    # The cloud platform's region/zone (config.platform), the node's locality when the pod has no locality label.
    platform_locality: Mapping[str, str] = field(default_factory=dict)
    # Not upstream: switches for an Envoy older than the template's (tests of the e2e tier use the default).
    deferred_cluster_creation: bool = True
    deferred_stats_creation: bool = True
    bypass_overload_manager: bool = True

    @property
    def node_type(self) -> str:
        return self.node_id.split("~")[0]

    @property
    def config_path(self) -> str:
        return str(self.proxy_config.get("configPath", ""))

    @property
    def admin_port(self) -> int:
        return int(self.proxy_config.get("proxyAdminPort", 0))

    @property
    def status_port(self) -> int:
        return int(self.proxy_config.get("statusPort", 0))

    @property
    def xds_socket(self) -> str:
        return f"{self.config_path}/XDS"

    @property
    def sds_socket(self) -> str:
        return f"{SDS_SOCKET_DIR}/{self.metadata.get('WORKLOAD_IDENTITY_SOCKET_FILE', '')}"

    @property
    def lightstep_token_path(self) -> str:
        """Upstream's `path.Join(configPath, ...)`: cleaned, so `./etc/istio/proxy` gives `etc/istio/proxy/...`."""
        return go_join(self.config_path, LIGHTSTEP_TOKEN_FILE)

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
        return "DELTA_GRPC" if self.delta_xds or self.node_type == "waypoint" else "GRPC"

    @property
    def metadata_discovery(self) -> bool:
        wanted = self.metadata.get("METADATA_DISCOVERY") == "true" or \
            self.node_type in PROXY_TYPES_WITH_METADATA_DISCOVERY
        if wanted and self.xds_type == "GRPC":
            log.warning("disabling metadata discovery; not supported on SotW xDS")
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


def _ip_version(text: str) -> int:
    try:
        return ipaddress.ip_address(text).version
    except ValueError:
        return 0


def address_family(ips: Sequence[str], dual_stack: bool) -> AddressFamily:
    """IPv4 when every IP is v4 (or there are none), IPv6 when every IP is v6; mixed needs ISTIO_DUAL_STACK,
    and then the first IP's family leads."""
    versions = [_ip_version(ip) for ip in ips]
    if all(v == 4 for v in versions):
        return AddressFamily("127.0.0.1", "0.0.0.0", "V4_ONLY")
    if all(v == 6 for v in versions):
        return AddressFamily("::1", "::", "V6_ONLY")
    if not dual_stack:
        return AddressFamily("127.0.0.1", "0.0.0.0", "V4_ONLY")
    if versions and versions[0] == 6:
        return AddressFamily("::1", "::", "ALL", "127.0.0.1", "0.0.0.0")
    return AddressFamily("127.0.0.1", "0.0.0.0", "ALL", "::1", "::")


_LOCALITY_LABELS = ("topology.istio.io/locality", "istio-locality")  # upstream's GetLocalityLabel order
_LOCALITY_PARTS = ("region", "zone", "sub_zone")


def locality_label(metadata: Mapping[str, Any]) -> str:
    """The pod's locality label as `region/zone/subzone`, "" when there is none (or it is empty).

    The first of topology.istio.io/locality and istio-locality present in LABELS
    counts, even when empty, as upstream's GetLocalityLabel; Kubernetes labels
    cannot hold `/`, so a label without one reads `.` as `/`.
    """
    labels = metadata.get("LABELS")
    if not isinstance(labels, Mapping):
        return ""
    text = next((str(labels[key]) for key in _LOCALITY_LABELS if key in labels), "")
    return text if "/" in text else text.replace(".", "/")


def locality(metadata: Mapping[str, Any], platform_locality: Mapping[str, str] | None = None) -> dict[str, str]:
    """Region/zone/sub-zone from the locality label; without a label, the platform's; empty parts omitted.

    `platform_locality` is what the cloud platform says (`config.platform.platform_locality`),
    used only when the pod has no locality label, as upstream asks its platform then.
    """
    text = locality_label(metadata)
    if not text:
        given = platform_locality or {}
        return {key: str(given[key]) for key in _LOCALITY_PARTS if given.get(key)}
    out: dict[str, str] = {}
    for key, value in zip(_LOCALITY_PARTS, text.split("/"), strict=False):
        if value:
            out[key] = value
    return out


# Label lookups go by presence (an empty value counts), in upstream's orders.
_CANONICAL_NAME_LABELS = ("service.istio.io/canonical-name", "app.kubernetes.io/name", "app")
_APP_LABELS = ("app", "app.kubernetes.io/name", "service.istio.io/canonical-name")


def _first_label(labels: Mapping[str, Any], keys: Sequence[str]) -> str | None:
    return next((str(labels[key]) for key in keys if key in labels), None)


def _canonical_name(labels: Mapping[str, Any], workload_name: str) -> str:
    name = _first_label(labels, _CANONICAL_NAME_LABELS)
    return workload_name if name is None else name


def service_cluster(proxy_config: Mapping[str, Any], metadata: Mapping[str, Any]) -> str:
    """Envoy's `node.cluster`: the configured name, else `<app>.<namespace>` as upstream derives it.

    `serviceCluster` and `tracingServiceName` are one oneof: whichever is set decides.
    """
    labels = metadata.get("LABELS")
    labels = labels if isinstance(labels, Mapping) else {}
    namespace = str(metadata.get("NAMESPACE", ""))
    workload = str(metadata.get("WORKLOAD_NAME", ""))

    def or_default(name: str) -> str:
        if name and name != "istio-proxy":
            return name
        app = _first_label(labels, _APP_LABELS)
        if app is not None:
            return f"{app}.{namespace}"
        if workload:
            return f"{workload}.{namespace}"
        if namespace:
            return f"istio-proxy.{namespace}"
        return "istio-proxy"

    if "tracingServiceName" in proxy_config:
        scheme = proxy_config["tracingServiceName"]
        name = _canonical_name(labels, workload or "istio-proxy")
        if scheme == "CANONICAL_NAME_ONLY":
            return or_default(name)
        if scheme == "CANONICAL_NAME_AND_NAMESPACE":
            return f"{name}.{namespace}" if namespace else or_default(name)
        return or_default("istio-proxy")
    return or_default(str(proxy_config.get("serviceCluster", "istio-proxy")))


def runtime_flags(proxy_config: Mapping[str, Any], compliance_policy: str, strip_fragment: bool) -> dict[str, Any]:
    """Envoy runtime overrides: Istio's defaults, then ProxyConfig `runtimeValues` ("" removes a default)."""
    flags: dict[str, Any] = {
        "re2.max_program_size.error_level": "32768",
        "envoy.deprecated_features:envoy.config.listener.v3.Listener.hidden_envoy_deprecated_use_original_dst": True,
        "envoy.reloadable_features.http_reject_path_with_fragment": False,
        "envoy.reloadable_features.fixed_heap_use_allocated": True,
        "envoy.reloadable_features.coalesce_lb_rebuilds_on_batch_update": False,
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


_GO_ATOI = re.compile(r"[+-]?[0-9]+")


def go_atoi(text: Any) -> int | None:
    """Go's strconv.Atoi: an optional sign and decimal digits, nothing else (no spaces); None when it fails."""
    if not isinstance(text, str) or not _GO_ATOI.fullmatch(text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def max_downstream_connections(proxy_config: Mapping[str, Any]) -> int:
    """The overload manager's limit, in upstream's precedence: a positive
    `connectionSettings.globalDownstreamConnectionLimit`; else the proxyMetadata entry
    `ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS`; else the deprecated runtime value
    `overload.global_downstream_max_connections`; else effectively unlimited."""
    settings = proxy_config.get("connectionSettings")
    if isinstance(settings, Mapping):
        limit = settings.get("globalDownstreamConnectionLimit")
        if isinstance(limit, int) and limit > 0:
            return limit
    from_metadata = go_atoi(dict(proxy_config.get("proxyMetadata") or {}).get(MAX_CONNECTIONS_PROXY_METADATA))
    if from_metadata is not None:
        return from_metadata
    from_runtime = go_atoi(dict(proxy_config.get("runtimeValues") or {}).get(MAX_CONNECTIONS_RUNTIME_KEY))
    if from_runtime is not None:
        return from_runtime
    return DEFAULT_MAX_DOWNSTREAM_CONNECTIONS
