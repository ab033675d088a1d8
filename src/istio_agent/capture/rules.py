"""The capture rule set, built by a pure function from a `CaptureConfig`.

`build_rules()` reproduces upstream's `IptablesConfigurator.Run()` rule by
rule and in the same order, because the order is the contract: the restore
text, the dry-run golden files, the cleanup order and the nftables rendering
are all derived from this one list. Rules are kept in upstream's own shape
(`-A CHAIN args...` / `-I CHAIN pos args...` per table, one list per IP
family) so that every renderer is a simple projection of it.

No I/O here: host facts (IPv6 on/off, DNS servers, proxy uid) must already be
resolved in the config.
"""

from __future__ import annotations

from istio_agent.capture.addr import parse_prefix
from istio_agent.capture.config import CaptureConfig, split

TYPE_CHECKING = False
if TYPE_CHECKING:
    from istio_agent.capture.addr import Prefix

# Chain names (upstream constants).
ISTIO_OUTPUT = "ISTIO_OUTPUT"
ISTIO_OUTPUT_DNS = "ISTIO_OUTPUT_DNS"
ISTIO_INBOUND = "ISTIO_INBOUND"
ISTIO_DIVERT = "ISTIO_DIVERT"
ISTIO_TPROXY = "ISTIO_TPROXY"
ISTIO_REDIRECT = "ISTIO_REDIRECT"
ISTIO_IN_REDIRECT = "ISTIO_IN_REDIRECT"
ISTIO_DROP = "ISTIO_DROP"

# Built-in chains and terminal targets: never declared with -N.
BUILTIN_CHAINS_AND_TARGETS = frozenset(
    {"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING", "ACCEPT", "RETURN", "DROP"}
)

OUTBOUND_MARK = "1338"
DNS_AGENT_PORT = "15053"
V6_LOOPBACK = "::1/128"
V4_INBOUND_PASSTHROUGH = "127.0.0.6/32"
V6_INBOUND_PASSTHROUGH = "::6/128"

_PER_FAMILY = "\x00per-family\x00"  # placeholder replaced by the v4 / v6 value


class Rule:
    """One rule: its table, the chain it lives in, and upstream's params list."""

    __slots__ = ("chain", "params", "table")

    def __init__(self, table: str, chain: str, params: tuple[str, ...]) -> None:
        self.table = table
        self.chain = chain
        self.params = params

    @property
    def is_insert(self) -> bool:
        return self.params[0] == "-I"

    @property
    def position(self) -> int:
        """1-based insert position (only for -I rules)."""
        return int(self.params[2])

    @property
    def spec(self) -> tuple[str, ...]:
        """Matches and target, without the -A/-I chain [pos] prefix."""
        return self.params[3:] if self.is_insert else self.params[2:]

    @property
    def jump_target(self) -> str | None:
        """The chain named by a final `-j X` (upstream only looks at the last pair)."""
        if len(self.params) >= 2 and self.params[-2] == "-j":
            return self.params[-1]
        return None

    def text(self) -> str:
        return " ".join(self.params)

    def __repr__(self) -> str:
        return f"Rule({self.table}: {self.text()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rule) and (self.table, self.chain, self.params) == (
            other.table,
            other.chain,
            other.params,
        )

    def __hash__(self) -> int:
        return hash((self.table, self.chain, self.params))


class RuleSet:
    """The rules for each IP family, in generation order."""

    __slots__ = ("v4", "v6")

    def __init__(self, v4: tuple[Rule, ...], v6: tuple[Rule, ...]) -> None:
        self.v4 = v4
        self.v6 = v6

    def family(self, v6: bool) -> tuple[Rule, ...]:
        return self.v6 if v6 else self.v4


class _Builder:
    """Upstream's IptablesRuleBuilder: append/insert to v4, v6 or both."""

    def __init__(self, ipv6: bool) -> None:
        self.ipv6 = ipv6
        self.v4: list[Rule] = []
        self.v6: list[Rule] = []

    def append_v4(self, chain: str, table: str, *spec: str) -> None:
        self.v4.append(Rule(table, chain, ("-A", chain, *spec)))

    def append_v6(self, chain: str, table: str, *spec: str) -> None:
        if self.ipv6:
            self.v6.append(Rule(table, chain, ("-A", chain, *spec)))

    def append(self, chain: str, table: str, *spec: str) -> None:
        self.append_v4(chain, table, *spec)
        self.append_v6(chain, table, *spec)

    def insert_v4(self, chain: str, table: str, pos: int, *spec: str) -> None:
        self.v4.append(Rule(table, chain, ("-I", chain, str(pos), *spec)))

    def insert_v6(self, chain: str, table: str, pos: int, *spec: str) -> None:
        if self.ipv6:
            self.v6.append(Rule(table, chain, ("-I", chain, str(pos), *spec)))

    def insert(self, chain: str, table: str, pos: int, *spec: str) -> None:
        self.insert_v4(chain, table, pos, *spec)
        self.insert_v6(chain, table, pos, *spec)

    def append_versioned(self, v4: str, v6: str, chain: str, table: str, *spec: str) -> None:
        """Append to both families, substituting a family-specific value."""
        self.append_v4(chain, table, *(v4 if s == _PER_FAMILY else s for s in spec))
        self.append_v6(chain, table, *(v6 if s == _PER_FAMILY else s for s in spec))

    def result(self) -> RuleSet:
        return RuleSet(tuple(self.v4), tuple(self.v6))


class NetworkRange:
    """One family's share of a CIDR list (upstream's NetworkRange)."""

    __slots__ = ("cidrs", "has_loopback", "wildcard")

    def __init__(self, wildcard: bool = False) -> None:
        self.wildcard = wildcard
        self.cidrs: list[Prefix] = []
        self.has_loopback = False


def separate_v4_v6(cidr_list: str) -> tuple[NetworkRange, NetworkRange]:
    """Split a comma list of CIDRs by family; `*` is a wildcard for both."""
    if cidr_list == "*":
        return NetworkRange(wildcard=True), NetworkRange(wildcard=True)
    v4, v6 = NetworkRange(), NetworkRange()
    for item in split(cidr_list):
        prefix = parse_prefix(item)  # validated beforehand; raises on bad input
        family = v4 if prefix.is_v4 else v6
        family.cidrs.append(prefix)
        family.has_loopback = family.has_loopback or prefix.is_loopback
    return v4, v6


def dns_capture_active(cfg: CaptureConfig) -> bool:
    """REDIRECT_DNS with neither capture-all nor any server disables DNS capture (upstream)."""
    if not cfg.redirect_dns:
        return False
    return cfg.capture_all_dns or bool(cfg.v4_dns_servers) or bool(cfg.v6_dns_servers)


def build_rules(cfg: CaptureConfig) -> RuleSet:
    """All capture rules for `cfg`, in upstream's generation order."""
    b = _Builder(cfg.ipv6)
    v4_exclude, v6_exclude = separate_v4_v6(cfg.outbound_ip_ranges_exclude)
    if v4_exclude.wildcard:
        raise ValueError("invalid value for OUTBOUND_IP_RANGES_EXCLUDE: '*' is not allowed")
    v4_include, v6_include = separate_v4_v6(cfg.outbound_ip_ranges_include)
    redirect_dns = dns_capture_active(cfg)
    loopback = cfg.host_ipv4_loopback_cidr
    tunnel = cfg.inbound_tunnel_port

    _exclude_interfaces(b, cfg)
    for iface in split(cfg.reroute_virtual_interfaces):
        b.insert("PREROUTING", "nat", 1, "-i", iface, "-j", "RETURN")
    if cfg.drop_invalid:
        b.append("PREROUTING", "mangle", "-m", "conntrack", "--ctstate", "INVALID", "-j", ISTIO_DROP)
        b.append(ISTIO_DROP, "mangle", "-j", "DROP")

    b.append(ISTIO_INBOUND, "nat", "-p", "tcp", "--dport", tunnel, "-j", "RETURN")
    b.append(ISTIO_REDIRECT, "nat", "-p", "tcp", "-j", "REDIRECT", "--to-ports", cfg.proxy_port)
    b.append(ISTIO_IN_REDIRECT, "nat", "-p", "tcp", "-j", "REDIRECT", "--to-ports", cfg.inbound_capture_port)
    _inbound_ports(b, cfg)

    b.append("OUTPUT", "nat", "-j", ISTIO_OUTPUT)
    for port in split(cfg.outbound_ports_exclude):
        b.append(ISTIO_OUTPUT, "nat", "-p", "tcp", "--dport", port, "-j", "RETURN")
        b.append(ISTIO_OUTPUT, "nat", "-p", "udp", "--dport", port, "-j", "RETURN")
    passthrough = (V4_INBOUND_PASSTHROUGH, V6_INBOUND_PASSTHROUGH)
    b.append_versioned(*passthrough, ISTIO_OUTPUT, "nat", "-o", "lo", "-s", _PER_FAMILY, "-j", "RETURN")

    keep_loopback_return = not v4_include.has_loopback and not v6_include.has_loopback
    for owner, ident in [("--uid-owner", u) for u in split(cfg.proxy_uid)] + [
        ("--gid-owner", g) for g in split(cfg.proxy_gid)
    ]:
        # App calls to itself through a service VIP go back through Envoy inbound.
        ports: tuple[str, ...]
        if redirect_dns and owner == "--uid-owner":
            ports = ("-m", "multiport", "!", "--dports", f"53,{tunnel}")
        else:
            ports = ("!", "--dport", tunnel)
        b.append_versioned(
            loopback, V6_LOOPBACK, ISTIO_OUTPUT, "nat",
            "-o", "lo", "!", "-d", _PER_FAMILY, "-p", "tcp", *ports,
            "-m", "owner", owner, ident, "-j", ISTIO_IN_REDIRECT,
        )  # fmt: skip
        # Other users talking over lo are left alone, unless loopback is explicitly captured.
        if keep_loopback_return:
            if redirect_dns:
                b.append(
                    ISTIO_OUTPUT, "nat", "-o", "lo", "-p", "tcp", "!", "--dport", "53",
                    "-m", "owner", "!", owner, ident, "-j", "RETURN",
                )  # fmt: skip
            else:
                b.append(ISTIO_OUTPUT, "nat", "-o", "lo", "-m", "owner", "!", owner, ident, "-j", "RETURN")
        # The proxy's own traffic is never captured again.
        b.append(ISTIO_OUTPUT, "nat", "-m", "owner", owner, ident, "-j", "RETURN")

    _owner_groups(b, cfg)
    if redirect_dns:
        _dns_redirect(b, cfg)

    b.append_versioned(loopback, V6_LOOPBACK, ISTIO_OUTPUT, "nat", "-d", _PER_FAMILY, "-j", "RETURN")
    for prefix in v4_exclude.cidrs:
        b.append_v4(ISTIO_OUTPUT, "nat", "-d", prefix.text, "-j", "RETURN")
    for prefix in v6_exclude.cidrs:
        b.append_v6(ISTIO_OUTPUT, "nat", "-d", prefix.text, "-j", "RETURN")
    for port in split(cfg.outbound_ports_include):
        b.append(ISTIO_OUTPUT, "nat", "-p", "tcp", "--dport", port, "-j", ISTIO_REDIRECT)
    _outbound_include(b, cfg, v4_include, v6=False)
    _outbound_include(b, cfg, v6_include, v6=True)

    if cfg.tproxy:
        _tproxy_marks(b, cfg)
    return b.result()


def _exclude_interfaces(b: _Builder, cfg: CaptureConfig) -> None:
    for iface in split(cfg.exclude_interfaces):
        b.append("PREROUTING", "nat", "-i", iface, "-j", "RETURN")
        b.append("OUTPUT", "nat", "-o", iface, "-j", "RETURN")
    if cfg.tproxy:
        for iface in split(cfg.exclude_interfaces):
            b.append("PREROUTING", "mangle", "-i", iface, "-j", "RETURN")
            b.append("OUTPUT", "mangle", "-o", iface, "-j", "RETURN")


def _inbound_ports(b: _Builder, cfg: CaptureConfig) -> None:
    """Inbound capture: nothing, every port (`*`, minus exclusions) or a port list."""
    if cfg.inbound_ports_include == "":
        return
    mark = cfg.inbound_tproxy_mark
    if cfg.tproxy:
        b.append(ISTIO_DIVERT, "mangle", "-j", "MARK", "--set-mark", mark)
        b.append(ISTIO_DIVERT, "mangle", "-j", "ACCEPT")
        b.append_versioned(
            cfg.host_ipv4_loopback_cidr, V6_LOOPBACK, ISTIO_TPROXY, "mangle",
            "!", "-d", _PER_FAMILY, "-p", "tcp", "-j", "TPROXY",
            "--tproxy-mark", f"{mark}/0xffffffff", "--on-port", cfg.inbound_capture_port,
        )  # fmt: skip
        table = "mangle"
    else:
        table = "nat"
    b.append("PREROUTING", table, "-p", "tcp", "-j", ISTIO_INBOUND)
    if cfg.inbound_ports_include == "*":
        for port in split(cfg.inbound_ports_exclude):
            b.append(ISTIO_INBOUND, table, "-p", "tcp", "--dport", port, "-j", "RETURN")
        if cfg.tproxy:
            b.append(
                ISTIO_INBOUND, "mangle", "-p", "tcp",
                "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", ISTIO_DIVERT,
            )  # fmt: skip
            b.append(ISTIO_INBOUND, "mangle", "-p", "tcp", "-j", ISTIO_TPROXY)
        else:
            b.append(ISTIO_INBOUND, "nat", "-p", "tcp", "-j", ISTIO_IN_REDIRECT)
        return
    for port in split(cfg.inbound_ports_include):
        if cfg.tproxy:
            b.append(
                ISTIO_INBOUND, "mangle", "-p", "tcp", "--dport", port,
                "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", ISTIO_DIVERT,
            )  # fmt: skip
            b.append(ISTIO_INBOUND, "mangle", "-p", "tcp", "--dport", port, "-j", ISTIO_TPROXY)
        else:
            b.append(ISTIO_INBOUND, "nat", "-p", "tcp", "--dport", port, "-j", ISTIO_IN_REDIRECT)


def _owner_groups(b: _Builder, cfg: CaptureConfig) -> None:
    """ISTIO_OUTBOUND_OWNER_GROUPS[_EXCLUDE]: which groups' traffic is captured."""
    if cfg.owner_groups_include == "*":
        for group in split(cfg.owner_groups_exclude):
            b.append(ISTIO_OUTPUT, "nat", "-m", "owner", "--gid-owner", group, "-j", "RETURN")
        return
    none_of: list[str] = []
    for group in split(cfg.owner_groups_include):
        none_of += ["-m", "owner", "!", "--gid-owner", group]
    b.append(ISTIO_OUTPUT, "nat", *none_of, "-j", "RETURN")


def _dns_redirect(b: _Builder, cfg: CaptureConfig) -> None:
    """Send DNS to the agent on :15053 and split DNS into conntrack zones."""
    all_dns = cfg.capture_all_dns
    servers_v4, servers_v6 = cfg.v4_dns_servers, cfg.v6_dns_servers
    b.append("OUTPUT", "raw", "-j", ISTIO_OUTPUT_DNS)
    if all_dns or servers_v4:
        b.append_v4(ISTIO_OUTPUT, "nat", "-j", ISTIO_OUTPUT_DNS)
    if all_dns or servers_v6:
        b.append_v6(ISTIO_OUTPUT, "nat", "-j", ISTIO_OUTPUT_DNS)
    for proto, to_ports in (("tcp", "--to-ports"), ("udp", "--to-port")):
        if all_dns:
            b.append(ISTIO_OUTPUT_DNS, "nat", "-p", proto, "--dport", "53", "-j", "REDIRECT", to_ports, DNS_AGENT_PORT)
            continue
        for server in servers_v4:
            b.append_v4(
                ISTIO_OUTPUT_DNS, "nat", "-p", proto, "--dport", "53", "-d", f"{server}/32",
                "-j", "REDIRECT", to_ports, DNS_AGENT_PORT,
            )  # fmt: skip
        for server in servers_v6:
            b.append_v6(
                ISTIO_OUTPUT_DNS, "nat", "-p", proto, "--dport", "53", "-d", f"{server}/128",
                "-j", "REDIRECT", to_ports, DNS_AGENT_PORT,
            )  # fmt: skip
    # Conntrack zones: agent <-> upstream resolvers in zone 1, apps <-> agent in zone 2.
    for owner, ident in [("--uid-owner", u) for u in split(cfg.proxy_uid)] + [
        ("--gid-owner", g) for g in split(cfg.proxy_gid)
    ]:
        b.append(ISTIO_OUTPUT_DNS, "raw", "-p", "udp", "--dport", "53", "-m", "owner", owner, ident,
                 "-j", "CT", "--zone", "1")  # fmt: skip
        b.append(ISTIO_OUTPUT_DNS, "raw", "-p", "udp", "--sport", DNS_AGENT_PORT, "-m", "owner", owner, ident,
                 "-j", "CT", "--zone", "2")  # fmt: skip
    if all_dns:
        b.append("PREROUTING", "raw", "-j", ISTIO_INBOUND)
        b.append(ISTIO_OUTPUT_DNS, "raw", "-p", "udp", "--dport", "53", "-j", "CT", "--zone", "2")
        b.append(ISTIO_INBOUND, "raw", "-p", "udp", "--sport", "53", "-j", "CT", "--zone", "1")
        return
    if servers_v4:
        b.append_v4("PREROUTING", "raw", "-j", ISTIO_INBOUND)
    for server in servers_v4:
        b.append_v4(ISTIO_OUTPUT_DNS, "raw", "-p", "udp", "--dport", "53", "-d", f"{server}/32",
                    "-j", "CT", "--zone", "2")  # fmt: skip
        b.append_v4(ISTIO_INBOUND, "raw", "-p", "udp", "--sport", "53", "-s", f"{server}/32",
                    "-j", "CT", "--zone", "1")  # fmt: skip
    if servers_v6:
        b.append_v6("PREROUTING", "raw", "-j", ISTIO_INBOUND)
    for server in servers_v6:
        b.append_v6(ISTIO_OUTPUT_DNS, "raw", "-p", "udp", "--dport", "53", "-d", f"{server}/128",
                    "-j", "CT", "--zone", "2")  # fmt: skip
        b.append_v6(ISTIO_INBOUND, "raw", "-p", "udp", "--sport", "53", "-s", f"{server}/128",
                    "-j", "CT", "--zone", "1")  # fmt: skip


def _outbound_include(b: _Builder, cfg: CaptureConfig, include: NetworkRange, v6: bool) -> None:
    append = b.append_v6 if v6 else b.append_v4
    insert = b.insert_v6 if v6 else b.insert_v4
    virtual = split(cfg.reroute_virtual_interfaces)
    if include.wildcard:
        append(ISTIO_OUTPUT, "nat", "-j", ISTIO_REDIRECT)
        for iface in virtual:
            insert("PREROUTING", "nat", 1, "-i", iface, "-j", ISTIO_REDIRECT)
        return
    for prefix in include.cidrs:
        for iface in virtual:
            insert("PREROUTING", "nat", 1, "-i", iface, "-d", prefix.text, "-j", ISTIO_REDIRECT)
        append(ISTIO_OUTPUT, "nat", "-d", prefix.text, "-j", ISTIO_REDIRECT)


def _tproxy_marks(b: _Builder, cfg: CaptureConfig) -> None:
    """TPROXY mode: mark handling so replies and proxy->app traffic route correctly."""
    mark = cfg.inbound_tproxy_mark
    loopback = cfg.host_ipv4_loopback_cidr
    b.append("PREROUTING", "mangle", "-p", "tcp", "-m", "mark", "--mark", mark, "-j", "CONNMARK", "--save-mark")
    b.append("OUTPUT", "mangle", "-p", "tcp", "-o", "lo", "-m", "mark", "--mark", mark, "-j", "RETURN")
    for owner, ident in [("--uid-owner", u) for u in split(cfg.proxy_uid)] + [
        ("--gid-owner", g) for g in split(cfg.proxy_gid)
    ]:
        b.append_versioned(
            loopback, V6_LOOPBACK, "OUTPUT", "mangle", "!", "-d", _PER_FAMILY, "-p", "tcp", "-o", "lo",
            "-m", "owner", owner, ident, "-j", "MARK", "--set-mark", OUTBOUND_MARK,
        )  # fmt: skip
    b.append("OUTPUT", "mangle", "-p", "tcp", "-m", "connmark", "--mark", mark, "-j", "CONNMARK", "--restore-mark")
    b.insert(ISTIO_INBOUND, "mangle", 1, "-p", "tcp", "-m", "mark", "--mark", mark, "-j", "RETURN")
    b.insert_v4(ISTIO_INBOUND, "mangle", 2, "-p", "tcp", "-s", V4_INBOUND_PASSTHROUGH, "-i", "lo", "-j", "RETURN")
    b.insert_v6(ISTIO_INBOUND, "mangle", 2, "-p", "tcp", "-s", V6_INBOUND_PASSTHROUGH, "-i", "lo", "-j", "RETURN")
    b.insert(ISTIO_INBOUND, "mangle", 3, "-p", "tcp", "-i", "lo", "-m", "mark", "!", "--mark", OUTBOUND_MARK,
             "-j", "RETURN")  # fmt: skip
