"""The proxy's identity towards istiod: node id and node metadata.

The node id `<type>~<ip>~<pod>.<namespace>~<domain>` is how istiod finds the
proxy's pod; the metadata is everything else istiod (and the bootstrap) reads
about it. Both are pure functions of the environment and pod files, so the
same inputs always give the same node.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from istio_agent.config import env
from istio_agent.config.errors import ConfigError

# The proxy types this agent runs (`pilot-agent proxy <type>`); upstream also knows ztunnel and
# agentgateway, which are other programs' node types.
PROXY_TYPES = ("sidecar", "router", "waypoint")
OTHER_UPSTREAM_TYPES = ("ztunnel", "agentgateway")

log = logging.getLogger(__name__)


LOOPBACKS = ("127.0.0.1", "::1")


def _valid_ip(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        return None


def private_addresses(interfaces: Sequence[tuple[str, str]]) -> list[str]:
    """Upstream's GetPrivateIPs over (interface, address) pairs of up, non-loopback interfaces.

    Loopback, link-local and unspecified addresses are skipped; IPv4-mapped IPv6 is unwrapped.
    """
    out: list[str] = []
    for _, text in interfaces:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            continue
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address.is_loopback or address.is_link_local or address.is_unspecified:
            continue
        if isinstance(address, ipaddress.IPv6Address) and address in _LINK_LOCAL_MULTICAST_V6:
            continue
        out.append(str(address))
    return out


_LINK_LOCAL_MULTICAST_V6 = ipaddress.IPv6Network("ff02::/16")


def instance_ips(environment: env.Environment, interfaces: Sequence[tuple[str, str]] = (),
                 excluded_interfaces: Sequence[str] = ()) -> list[str]:
    """The proxy's IPs as upstream's initProxy lists them: `INSTANCE_IP` first, then the host's.

    After `INSTANCE_IP` (and our `INSTANCE_IPS`) come the private addresses of the
    up interfaces (`interfaces`, as `capture.hostfacts.up_interface_addresses`
    reads them), or 127.0.0.1 and ::1 when there are none; minus the addresses
    of the interfaces the `traffic.sidecar.istio.io/excludeInterfaces` annotation
    names and minus what is already listed.
    """
    given = [("INSTANCE_IP", environment.get(env.INSTANCE_IP))] if environment.get(env.INSTANCE_IP) else []
    given += [("INSTANCE_IPS", text) for text in environment.get(env.INSTANCE_IPS).split(",") if text.strip()]
    first = []
    for name, text in given:
        ip = _valid_ip(text)
        if ip is None:  # upstream drops it without a word; the proxy then goes by the host's addresses
            log.warning("environment variable %s=%r is not an IP address: ignored", name, text)
        else:
            first.append(ip)
    listed = list(dict.fromkeys(first))
    found = private_addresses(interfaces) or list(LOOPBACKS)
    excluded = {address for name, address in interfaces if name in set(excluded_interfaces)} | set(listed)
    return listed + [ip for ip in found if ip not in excluded]


def default_domain(namespace: str) -> str:
    """Upstream's getDNSDomain: `<namespace>.svc.cluster.local`, even for an empty namespace."""
    return f"{namespace}.svc.cluster.local"


def check_proxy_type(proxy_type: str) -> str:
    """The type, or ConfigError naming the supported ones (and saying so when upstream knows it)."""
    if proxy_type in PROXY_TYPES:
        return proxy_type
    supported = ", ".join(PROXY_TYPES)
    if proxy_type in OTHER_UPSTREAM_TYPES:
        raise ConfigError(f"proxy type {proxy_type!r} is not run by pilot-agent here; supported types: {supported}")
    raise ConfigError(f"invalid proxy type {proxy_type!r}; supported types: {supported}")


def node_id(proxy_type: str, ip: str, pod_name: str, namespace: str, domain: str) -> str:
    check_proxy_type(proxy_type)
    return f"{proxy_type}~{ip}~{pod_name}.{namespace}~{domain}"


@dataclass(frozen=True)
class NodeIdentity:
    """Who this proxy is: what goes into the node id and the SPIFFE id."""

    proxy_type: str
    ips: tuple[str, ...]
    pod_name: str
    namespace: str
    service_account: str
    domain: str
    trust_domain: str
    cluster_id: str

    @property
    def id(self) -> str:
        return node_id(self.proxy_type, self.ips[0], self.pod_name, self.namespace, self.domain)

    @property
    def spiffe_id(self) -> str:
        return f"spiffe://{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"


def identity_from_env(environment: env.Environment, proxy_type: str, domain: str | None,
                      ips: Sequence[str] | None = None) -> NodeIdentity:
    """Who this proxy is, from the environment; `ips` as `instance_ips` lists them (default: no host interfaces)."""
    namespace = environment.get(env.POD_NAMESPACE)
    if not namespace:  # upstream carries on; istiod then cannot place the proxy, nor the CA sign its identity
        log.warning("environment variable POD_NAMESPACE is empty: the node id and the workload identity "
                    "(spiffe://.../ns//sa/...) name no namespace")
    return NodeIdentity(
        proxy_type=check_proxy_type(proxy_type),
        ips=tuple(ips if ips is not None else instance_ips(environment)),
        pod_name=environment.get(env.POD_NAME),
        namespace=namespace,
        service_account=environment.get(env.SERVICE_ACCOUNT),
        domain=domain or default_domain(namespace),
        trust_domain=environment.get(env.TRUST_DOMAIN),
        cluster_id=environment.get(env.ISTIO_META_CLUSTER_ID),
    )


# Typed node-metadata keys whose values upstream parses as Go's StringBool: "true"
# spellings come out as "true"; false is omitted from the typed form, so the raw
# value stays.
STRING_BOOL_KEYS = (
    "ENABLE_SELF_DISCOVERY", "DNS_CAPTURE", "DNS_AUTO_ALLOCATE", "ENABLE_HBONE", "DISABLE_HBONE_SEND",
    "EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "INBOUND_LISTENER_EXACT_BALANCE", "OUTBOUND_LISTENER_EXACT_BALANCE",
    "ENVOY_SKIP_DEPRECATED_LOGS",
)  # in upstream's struct order, which is the order node_metadata writes them
# Of those, the ones upstream sets from the agent's own options, whatever ISTIO_META_* says.
_OPTION_BOOL_KEYS = frozenset({"EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "ENVOY_SKIP_DEPRECATED_LOGS"})
_LOCALITY_LABEL = "istio-locality"
_TOPOLOGY_LOCALITY_LABEL = "topology.istio.io/locality"  # read before istio-locality, as upstream
# Raw keys upstream adds for the SDS sockets found at start (security.CredentialMetaDataName and
# CredentialFileMetaDataName); the second makes the bootstrap add the `sds-files-grpc` cluster.
CREDENTIAL_KEY = "credential"
FILE_CREDENTIAL_KEY = "file-credential"


@dataclass(frozen=True)
class MetadataOptions:
    """What node metadata is made of (upstream's `bootstrap.MetadataOptions`).

    `environment` supplies the `ISTIO_META_*` / `ISTIO_METAJSON_*` layers and the
    pod's name, namespace and service account; everything decided elsewhere (the
    DNS proxy's address when it runs, PILOT_SAN, the Istio version) comes in as a
    value, so this function makes no policy of its own.
    """

    environment: env.Environment
    proxy_config: Mapping[str, Any]  # ProxyConfig in protojson shape
    instance_ips: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)  # the pod-labels file (empty when absent)
    labels_file: bool = False  # that file is there, even empty
    annotations: Mapping[str, str] = field(default_factory=dict)  # the pod-annotations file
    pilot_san: tuple[str, ...] = ()
    outlier_log_path: str = ""
    envoy_status_port: int = 15021
    envoy_prometheus_port: int = 15090
    envoy_secure_metrics_port: int = 0  # 0: no mTLS listener for Envoy's stats
    envoy_secure_merged_metrics_port: int = 0  # 0: no mTLS listener for the merged stats
    workload_identity_socket_file: str = "socket"
    # PEER_METADATA_DISCOVERY when set; None (unset) follows ENABLE_HBONE, as upstream.
    metadata_discovery: bool | None = None
    exit_on_zero_active_connections: bool = False
    envoy_skip_deprecated_logs: bool = False
    sts_port: int = 0
    istio_version: str = ""
    credential_socket_exists: bool = False
    custom_credentials_file_exists: bool = False  # another SDS server owns the workload socket
    dns_proxy_addr: str = ""  # set only when the agent runs its DNS proxy
    # PLATFORM_METADATA: what the cloud platform's environment says (config.platform.discover); empty: left out.
    platform_metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MetadataLayers:
    """Node metadata's two layers, as upstream keeps them.

    `raw`: the `ISTIO_META_*` values, then every `ISTIO_METAJSON_*` object merged
    into the top level. `typed`: the fields of upstream's typed struct
    (PROXY_CONFIG, LABELS, ANNOTATIONS, INSTANCE_IPS, ports, ...); a typed field
    holding `{}` is one upstream set to empty after reading the raw map (LABELS
    when a pod-labels file gives none), which Go's `omitempty` leaves out.
    """

    typed: dict[str, Any]
    raw: dict[str, Any]

    def merged(self) -> dict[str, Any]:
        """What Envoy's bootstrap carries and istiod gets: a typed field wins over a raw key of the same
        name, an empty one lets the raw key show through, every other raw key is kept."""
        meta = {key: value for key, value in self.typed.items() if value != {}}
        for key, value in self.raw.items():
            meta.setdefault(key, value)
        return meta

    def typed_view(self) -> dict[str, Any]:
        """The merged map less the raw keys a typed field emptied: what upstream's typed struct holds once
        the raw map was read into it (the gRPC bootstrap encodes that struct alone)."""
        emptied = {key for key, value in self.typed.items() if value == {}}
        return {key: value for key, value in self.merged().items() if key not in emptied}


def node_metadata(options: MetadataOptions) -> dict[str, Any]:
    """Node metadata as upstream's bootstrap writes it (and sends it to istiod): `MetadataLayers.merged`.

    `istio-locality` in the labels is rewritten from `a.b.c` to `a/b/c`.
    """
    return node_metadata_layers(options).merged()


def node_metadata_layers(options: MetadataOptions) -> MetadataLayers:
    """The raw and typed layers of node metadata (`MetadataLayers`)."""
    environment = options.environment
    raw: dict[str, Any] = {}
    for key, value in dict(options.proxy_config.get("proxyMetadata") or {}).items():
        if key.startswith(env.ISTIO_META_PREFIX):
            raw[key[len(env.ISTIO_META_PREFIX):]] = value
    for key, value in environment.with_prefix(env.ISTIO_META_PREFIX):
        raw[key] = value
    static_labels: dict[str, str] = {}
    for key, text in environment.with_prefix(env.ISTIO_METAJSON_PREFIX):
        parsed = _json_object(f"{env.ISTIO_METAJSON_PREFIX}{key}", text)
        raw.update(parsed)
        if key == "LABELS" and parsed and all(isinstance(v, str) for v in parsed.values()):
            static_labels = dict(parsed)

    typed: dict[str, Any] = {}
    for key in ("ISTIO_VERSION", "NAME", "NAMESPACE", "SERVICE_ACCOUNT"):
        if isinstance(raw.get(key), str) and raw[key]:
            typed[key] = raw[key]
    for key in STRING_BOOL_KEYS:
        if key in raw and key not in _OPTION_BOOL_KEYS and _string_bool(key, raw[key]):
            typed[key] = "true"
    if "ISTIO_VERSION" not in typed and options.istio_version:
        typed["ISTIO_VERSION"] = options.istio_version
    unique_ips = list(dict.fromkeys(options.instance_ips))
    if unique_ips:
        typed["INSTANCE_IPS"] = ",".join(unique_ips)
    if options.sts_port:
        typed["STS_PORT"] = str(options.sts_port)
    if options.envoy_status_port:
        typed["ENVOY_STATUS_PORT"] = options.envoy_status_port
    if options.envoy_prometheus_port:
        typed["ENVOY_PROMETHEUS_PORT"] = options.envoy_prometheus_port
    if options.envoy_secure_metrics_port:
        typed["ENVOY_SECURE_METRICS_PORT"] = options.envoy_secure_metrics_port
    if options.envoy_secure_merged_metrics_port:
        typed["ENVOY_SECURE_MERGED_METRICS_PORT"] = options.envoy_secure_merged_metrics_port
    if options.exit_on_zero_active_connections:
        typed["EXIT_ON_ZERO_ACTIVE_CONNECTIONS"] = "true"
    if options.envoy_skip_deprecated_logs:
        typed["ENVOY_SKIP_DEPRECATED_LOGS"] = "true"
    discovery = options.metadata_discovery
    if discovery is None:  # unset: on exactly when the proxy is in an ambient mesh (ENABLE_HBONE)
        discovery = typed.get("ENABLE_HBONE") == "true"
    typed["METADATA_DISCOVERY"] = "true" if discovery else "false"
    typed["PROXY_CONFIG"] = dict(options.proxy_config)
    pod_vars = ((env.POD_NAME, "NAME"), (env.POD_NAMESPACE, "NAMESPACE"), (env.SERVICE_ACCOUNT, "SERVICE_ACCOUNT"))
    for var, key in pod_vars:
        if environment.get(var):
            typed[key] = environment.get(var)

    # STATIC_LABELS come only from ISTIO_METAJSON_LABELS; a LABELS key of another ISTIO_METAJSON_* variable is
    # LABELS alone (upstream's extractAttributesMetadata looks at that one variable).
    merged_labels = {str(k): str(v) for k, v in raw["LABELS"].items()} if isinstance(raw.get("LABELS"), dict) else {}
    pod_labels = {k: v for k, v in options.labels.items() if k != "pod-template-hash"}
    # Upstream's LABELS and STATIC_LABELS are one map unless a pod-labels file exists (even an empty one: then
    # LABELS is STATIC_LABELS and the file's), so the locality rewrite below shows in both.
    with_file = options.labels_file or bool(pod_labels)
    all_labels = {**static_labels, **pod_labels} if with_file else (static_labels or merged_labels)
    locality = sanitize_locality(all_labels.get(_TOPOLOGY_LOCALITY_LABEL, all_labels.get(_LOCALITY_LABEL, "")))
    if locality:
        all_labels[_LOCALITY_LABEL] = locality
    if all_labels or with_file:  # with the file, LABELS is decided here even when empty (see MetadataLayers)
        typed["LABELS"] = all_labels
    if static_labels:
        typed["STATIC_LABELS"] = static_labels
    all_annotations = dict(raw["ANNOTATIONS"]) if isinstance(raw.get("ANNOTATIONS"), dict) else {}
    all_annotations.update(options.annotations)
    if all_annotations:
        typed["ANNOTATIONS"] = all_annotations
    if options.pilot_san:
        typed["PILOT_SAN"] = list(options.pilot_san)
    if options.outlier_log_path:
        typed["OUTLIER_LOG_PATH"] = options.outlier_log_path
    if options.workload_identity_socket_file:
        typed["WORKLOAD_IDENTITY_SOCKET_FILE"] = options.workload_identity_socket_file
    if options.platform_metadata:  # replaces a PLATFORM_METADATA from ISTIO_METAJSON_* only when there is some
        typed["PLATFORM_METADATA"] = dict(options.platform_metadata)
    if options.credential_socket_exists:
        raw[CREDENTIAL_KEY] = "true"
    if options.custom_credentials_file_exists:
        raw[FILE_CREDENTIAL_KEY] = "true"
    if options.dns_proxy_addr:
        raw.setdefault("DNS_PROXY_ADDR", options.dns_proxy_addr)

    return MetadataLayers(typed, raw)


def sanitize_locality(label: str) -> str:
    """A locality label as `region/zone/subzone`: Kubernetes labels cannot hold `/`, so `.` stands in for it."""
    return label if "/" in label else label.replace(".", "/")


def _json_object(name: str, text: str) -> dict[str, Any]:
    """One ISTIO_METAJSON_* value; like upstream, a bad value is logged and ignored, not fatal."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        log.warning("environment variable %s: invalid JSON, ignored: %s", name, exc)
        return {}
    if not isinstance(value, dict):
        log.warning("environment variable %s: expected a JSON object, ignored", name)
        return {}
    return value


def _string_bool(key: str, value: Any) -> bool:
    """A boolean metadata value; an unreadable one is kept as written (logged), not fatal."""
    try:
        return env.parse_bool(str(value))
    except ValueError:
        log.warning("node metadata %s=%r: expected true or false; kept as written", key, value)
        return False


ISTIOD_HOST = "istiod.istio-system.svc"


def pilot_sans(discovery_address: str, control_plane_auth_policy: str) -> list[str]:
    """PILOT_SAN metadata, as upstream's GetPilotSan: the discovery host (`localhost` meaning istiod).

    Only under MUTUAL_TLS control-plane authentication; otherwise there is nothing to verify.
    """
    if control_plane_auth_policy != "MUTUAL_TLS":
        return []
    host = discovery_address.split(":")[0]
    return [ISTIOD_HOST if host == "localhost" else host]

