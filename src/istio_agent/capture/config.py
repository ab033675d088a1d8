"""The traffic-capture configuration: one options object, upstream's field names.

`CaptureConfig` mirrors upstream's `tools/common/config.Config` field for field
(the JSON keys in `FIELDS` are upstream's, as used by the conformance kit), so
that the rule builder can be driven either from the CLI or straight from a
kit case. Values stay strings where upstream keeps strings (ports, uid lists,
CIDR lists): the rule text is built from them verbatim, and `validation`
checks every one of them before anything is built.

A plain `__slots__` class rather than a dataclass: `dataclasses` drags in
`inspect` and costs ~15 ms of start-up, which `istio-iptables` cannot afford.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# (attribute, upstream JSON key, default). Order follows upstream's Config.
FIELDS: tuple[tuple[str, str, object], ...] = (
    ("proxy_port", "PROXY_PORT", "15001"),
    ("inbound_capture_port", "INBOUND_CAPTURE_PORT", "15006"),
    ("inbound_tunnel_port", "INBOUND_TUNNEL_PORT", "15008"),
    ("proxy_uid", "PROXY_UID", ""),
    ("proxy_gid", "PROXY_GID", ""),
    ("inbound_interception_mode", "INBOUND_INTERCEPTION_MODE", ""),
    ("inbound_tproxy_mark", "INBOUND_TPROXY_MARK", "1337"),
    ("inbound_tproxy_route_table", "INBOUND_TPROXY_ROUTE_TABLE", "133"),
    ("inbound_ports_include", "INBOUND_PORTS_INCLUDE", ""),
    ("inbound_ports_exclude", "INBOUND_PORTS_EXCLUDE", ""),
    ("owner_groups_include", "OUTBOUND_OWNER_GROUPS_INCLUDE", "*"),
    ("owner_groups_exclude", "OUTBOUND_OWNER_GROUPS_EXCLUDE", ""),
    ("outbound_ports_include", "OUTBOUND_PORTS_INCLUDE", ""),
    ("outbound_ports_exclude", "OUTBOUND_PORTS_EXCLUDE", ""),
    ("outbound_ip_ranges_include", "OUTBOUND_IPRANGES_INCLUDE", ""),
    ("outbound_ip_ranges_exclude", "OUTBOUND_IPRANGES_EXCLUDE", ""),
    ("reroute_virtual_interfaces", "KUBE_VIRT_INTERFACES", ""),
    ("exclude_interfaces", "EXCLUDE_INTERFACES", ""),
    ("iptables_probe_port", "IPTABLES_PROBE_PORT", "15002"),
    ("probe_timeout", "PROBE_TIMEOUT", "5s"),
    ("dry_run", "DRY_RUN", False),
    ("skip_rule_apply", "SKIP_RULE_APPLY", False),
    ("run_validation", "RUN_VALIDATION", False),
    ("redirect_dns", "REDIRECT_DNS", False),
    ("drop_invalid", "DROP_INVALID", False),
    ("capture_all_dns", "CAPTURE_ALL_DNS", False),
    # None means "detect from the host" (upstream always detects; we allow pinning).
    ("enable_ipv6", "ENABLE_INBOUND_IPV6", None),
    ("dns_servers_v4", "DNS_SERVERS_V4", None),
    ("dns_servers_v6", "DNS_SERVERS_V6", None),
    ("network_namespace", "NETWORK_NAMESPACE", ""),
    ("cni_mode", "CNI_MODE", False),
    ("dual_stack", "DUAL_STACK", False),
    ("host_ipv4_loopback_cidr", "HOST_IPV4_LOOPBACK_CIDR", "127.0.0.1/32"),
    ("reconcile", "RECONCILE", False),
    ("cleanup_only", "CLEANUP_ONLY", False),
    ("force_apply", "FORCE_APPLY", False),
    ("native_nftables", "NATIVE_NFTABLES", False),
    ("force_iptables_binary", "FORCE_IPTABLES_BINARY", ""),
)


class CaptureConfig:
    """Every setting of one `istio-iptables` run (see `FIELDS` for defaults)."""

    __slots__ = tuple(name for name, _, _ in FIELDS)

    proxy_port: str
    inbound_capture_port: str
    inbound_tunnel_port: str
    proxy_uid: str
    proxy_gid: str
    inbound_interception_mode: str
    inbound_tproxy_mark: str
    inbound_tproxy_route_table: str
    inbound_ports_include: str
    inbound_ports_exclude: str
    owner_groups_include: str
    owner_groups_exclude: str
    outbound_ports_include: str
    outbound_ports_exclude: str
    outbound_ip_ranges_include: str
    outbound_ip_ranges_exclude: str
    reroute_virtual_interfaces: str
    exclude_interfaces: str
    iptables_probe_port: str
    probe_timeout: str
    dry_run: bool
    skip_rule_apply: bool
    run_validation: bool
    redirect_dns: bool
    drop_invalid: bool
    capture_all_dns: bool
    enable_ipv6: bool | None
    dns_servers_v4: list[str] | None
    dns_servers_v6: list[str] | None
    network_namespace: str
    cni_mode: bool
    dual_stack: bool
    host_ipv4_loopback_cidr: str
    reconcile: bool
    cleanup_only: bool
    force_apply: bool
    native_nftables: bool
    force_iptables_binary: str

    def __init__(self, **values: object) -> None:
        unknown = set(values) - set(self.__slots__)
        if unknown:
            raise TypeError(f"unknown CaptureConfig fields: {sorted(unknown)}")
        for name, _, default in FIELDS:
            value = values.get(name, default)
            setattr(self, name, list(value) if isinstance(value, list | tuple) else value)

    def replace(self, **changes: object) -> CaptureConfig:
        """A copy with some fields changed (configs are treated as values)."""
        return CaptureConfig(**{**self.as_dict(), **changes})

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CaptureConfig) and self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        changed = {n: v for n, _, d in FIELDS if (v := getattr(self, n)) != d}
        return f"CaptureConfig({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    # Derived views used by the builder; they follow upstream's string semantics.

    @property
    def tproxy(self) -> bool:
        return self.inbound_interception_mode == "TPROXY"

    @property
    def ipv6(self) -> bool:
        """IPv6 rules are produced only when the host fact says so."""
        return bool(self.enable_ipv6)

    @property
    def v4_dns_servers(self) -> list[str]:
        return self.dns_servers_v4 or []

    @property
    def v6_dns_servers(self) -> list[str]:
        return self.dns_servers_v6 or []


def split(value: str) -> list[str]:
    """Upstream's `config.Split`: comma list, empty items dropped, nothing trimmed."""
    if value == "":
        return []
    return [item for item in value.split(",") if item != ""]


def from_upstream_json(data: Mapping[str, object]) -> CaptureConfig:
    """Build a config from upstream's JSON field names (the kit's `config` objects)."""
    by_key = {key: name for name, key, _ in FIELDS}
    values: dict[str, object] = {}
    for key, value in data.items():
        if key not in by_key:
            raise ValueError(f"unknown upstream config key {key!r}")
        values[by_key[key]] = value
    return CaptureConfig(**values)
