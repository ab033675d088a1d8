"""Strict checks of every value that could end up in a rule, before any rule is built.

Upstream passes most values to iptables verbatim, so a crafted value such as
an interface name of `eth0 -j ACCEPT` becomes extra rule arguments
(CVE-2026-23766). Here every port, CIDR, interface name, uid/gid, group,
mark, table and mode is checked against what the kernel tools accept, and
the first problem is reported as a `ConfigError` naming the field and the
offending value. Nothing is built or applied unless `validate()` passes.
"""

from __future__ import annotations

from istio_agent.capture.addr import parse_addr, parse_prefix
from istio_agent.capture.config import CaptureConfig, split

MAX_OWNER_GROUPS_INCLUDE = 64  # upstream: all groups go into a single rule
MAX_ID = 4294967294  # (uid_t)-1 is "no user"
IFNAMSIZ = 16
_IFACE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_GROUP_CHARS = _IFACE_CHARS
_RESERVED_TABLES = {"0", "253", "254", "255"}
_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


class ConfigError(ValueError):
    """A setting that cannot be used; `field` is the CaptureConfig attribute."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        super().__init__(f"invalid {field} {value!r}: {reason}")
        self.field = field
        self.value = value
        self.reason = reason


def _decimal(text: str, low: int, high: int) -> int | None:
    """A plain decimal in [low, high] (no sign, no spaces, no leading zeros), else None."""
    if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        return None
    value = int(text)
    return value if low <= value <= high else None


def check_port(field: str, text: str) -> None:
    if _decimal(text, 1, 65535) is None:
        raise ConfigError(field, text, "not a port number (1-65535)")


def check_port_list(field: str, text: str, wildcard: bool = False) -> None:
    if wildcard and text == "*":
        return
    for item in split(text):
        if _decimal(item, 1, 65535) is None:
            hint = " or '*'" if wildcard else ""
            raise ConfigError(field, text, f"{item!r} is not a port number (1-65535){hint}")


def check_id_list(field: str, text: str) -> None:
    for item in split(text):
        if _decimal(item, 0, MAX_ID) is None:
            raise ConfigError(field, text, f"{item!r} is not a numeric id")


def check_interface(field: str, name: str) -> None:
    """Linux interface names: 1-15 chars, no spaces or slashes; `+` only as iptables' suffix wildcard."""
    body = name[:-1] if name.endswith("+") else name
    if not body or len(name) >= IFNAMSIZ or name in (".", ".."):
        raise ConfigError(field, name, "not a valid interface name")
    if body.startswith("-") or not set(body) <= _IFACE_CHARS:
        raise ConfigError(field, name, "not a valid interface name")


def check_interface_list(field: str, text: str) -> None:
    for item in split(text):
        try:
            check_interface(field, item)
        except ConfigError:
            raise ConfigError(field, text, f"{item!r} is not a valid interface name") from None


def check_cidr_list(field: str, text: str, wildcard: bool) -> None:
    if text == "*":
        if wildcard:
            return
        raise ConfigError(field, text, "'*' is not allowed here")
    for item in split(text):
        try:
            parse_prefix(item)
        except ValueError as err:
            raise ConfigError(field, text, str(err)) from None


def check_groups(field: str, text: str, wildcard: bool) -> None:
    if wildcard and text == "*":
        return
    for item in split(text):
        if _decimal(item, 0, MAX_ID) is not None:
            continue
        if len(item) > 32 or item[0] in "-." or item[0].isdigit() or not set(item) <= _GROUP_CHARS:
            raise ConfigError(field, text, f"{item!r} is not a group name or numeric gid")


def check_loopback_cidr(field: str, text: str) -> None:
    """Upstream's ValidateIPv4LoopbackCidr: an IPv4 loopback prefix with a /8../32 mask."""
    try:
        prefix = parse_prefix(text)
    except ValueError as err:
        raise ConfigError(field, text, str(err)) from None
    if not prefix.is_v4 or not prefix.is_loopback:
        raise ConfigError(field, text, "expected an IPv4 loopback range")
    if not 8 <= prefix.bits <= 32:
        raise ConfigError(field, text, "expected a mask in range [8, 32]")


def check_servers(field: str, servers: list[str] | None, v4: bool) -> None:
    for server in servers or []:
        address, percent, zone = server.partition("%")  # an IPv6 zone, as resolv.conf may give (`fe80::1%eth0`)
        try:
            packed = parse_addr(address)
        except ValueError as err:
            raise ConfigError(field, server, str(err)) from None
        if (len(packed) == 4) != v4:
            raise ConfigError(field, server, f"not an IPv{'4' if v4 else '6'} address")
        if percent and (v4 or not zone or not set(zone) <= _IFACE_CHARS):
            raise ConfigError(field, server, "not a valid IPv6 zone")


def parse_duration(text: str) -> float:
    """Go's time.ParseDuration (e.g. `5s`, `1m30s`, `250ms`), in seconds; ValueError when malformed."""
    if text == "0":
        return 0.0
    total, rest = 0.0, text
    if not rest:
        raise ValueError(f"invalid duration {text!r}")
    while rest:
        i = 0
        while i < len(rest) and (rest[i].isdigit() or rest[i] == "."):
            i += 1
        number, rest = rest[:i], rest[i:]
        j = 0
        while j < len(rest) and not (rest[j].isdigit() or rest[j] == "."):
            j += 1
        unit, rest = rest[:j], rest[j:]
        if not number or number == "." or number.count(".") > 1 or unit not in _DURATION_UNITS:
            raise ValueError(f"invalid duration {text!r}")
        total += float(number) * _DURATION_UNITS[unit]
    return total


def validate(cfg: CaptureConfig) -> None:
    """Raise ConfigError for the first unusable value in `cfg`."""
    for field in ("proxy_port", "inbound_capture_port", "inbound_tunnel_port", "iptables_probe_port"):
        check_port(field, getattr(cfg, field))
    check_port_list("inbound_ports_include", cfg.inbound_ports_include, wildcard=True)
    for field in ("inbound_ports_exclude", "outbound_ports_include", "outbound_ports_exclude"):
        check_port_list(field, getattr(cfg, field))
    check_id_list("proxy_uid", cfg.proxy_uid)
    check_id_list("proxy_gid", cfg.proxy_gid)
    if cfg.inbound_interception_mode not in ("", "REDIRECT", "TPROXY"):
        raise ConfigError("inbound_interception_mode", cfg.inbound_interception_mode, "expected REDIRECT or TPROXY")
    if _decimal(cfg.inbound_tproxy_mark, 1, 0xFFFFFFFF) is None:
        raise ConfigError("inbound_tproxy_mark", cfg.inbound_tproxy_mark, "not a decimal mark (1-4294967295)")
    table = cfg.inbound_tproxy_route_table
    if _decimal(table, 1, 0xFFFFFFFF) is None or table in _RESERVED_TABLES:
        raise ConfigError(
            "inbound_tproxy_route_table", table, "not a usable routing table id (1-4294967295, not 253-255)"
        )
    check_interface_list("exclude_interfaces", cfg.exclude_interfaces)
    check_interface_list("reroute_virtual_interfaces", cfg.reroute_virtual_interfaces)
    check_cidr_list("outbound_ip_ranges_include", cfg.outbound_ip_ranges_include, wildcard=True)
    check_cidr_list("outbound_ip_ranges_exclude", cfg.outbound_ip_ranges_exclude, wildcard=False)
    check_groups("owner_groups_include", cfg.owner_groups_include, wildcard=True)
    check_groups("owner_groups_exclude", cfg.owner_groups_exclude, wildcard=False)
    if cfg.owner_groups_include != "*" and len(split(cfg.owner_groups_include)) > MAX_OWNER_GROUPS_INCLUDE:
        raise ConfigError(
            "owner_groups_include", cfg.owner_groups_include, f"at most {MAX_OWNER_GROUPS_INCLUDE} groups are allowed"
        )
    check_loopback_cidr("host_ipv4_loopback_cidr", cfg.host_ipv4_loopback_cidr)
    check_servers("dns_servers_v4", cfg.dns_servers_v4, v4=True)
    check_servers("dns_servers_v6", cfg.dns_servers_v6, v4=False)
    try:
        parse_duration(cfg.probe_timeout)
    except ValueError as err:
        raise ConfigError("probe_timeout", cfg.probe_timeout, str(err)) from None
    if cfg.force_iptables_binary not in ("", "legacy", "nft"):
        raise ConfigError("force_iptables_binary", cfg.force_iptables_binary, "expected 'legacy' or 'nft'")
    if "\x00" in cfg.network_namespace:
        raise ConfigError("network_namespace", cfg.network_namespace, "not a path")
