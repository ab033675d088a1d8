"""Render the capture rules as a native nftables script (`--native-nftables`).

The same rule list that feeds `iptables-restore` is translated here, so both
backends capture exactly the same traffic. Each iptables table becomes an
nftables table of its own per family (`ip istio-proxy-nat`, `ip6
istio-proxy-nat`, `... -mangle`, `... -raw`); its base chains use the hook,
type and priority of the iptables table they stand for (mangle OUTPUT is a
`route` chain so that a changed mark re-routes, as in iptables). Insert
positions are resolved here, since the tables are ours alone.

The script first creates-then-deletes every table it owns and then rebuilds
them, so one `nft -f` transaction replaces the old rules atomically and
running it twice leaves the same ruleset.
"""

from __future__ import annotations

from istio_agent.capture.rules import BUILTIN_CHAINS_AND_TARGETS, Rule, RuleSet

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

TABLES = ("mangle", "nat", "raw")
FAMILIES = ("ip", "ip6")
TABLE_PREFIX = "istio-proxy-"

BASE_CHAINS = {
    ("nat", "PREROUTING"): "type nat hook prerouting priority -100; policy accept;",
    ("nat", "OUTPUT"): "type nat hook output priority -100; policy accept;",
    ("mangle", "PREROUTING"): "type filter hook prerouting priority -150; policy accept;",
    ("mangle", "OUTPUT"): "type route hook output priority -150; policy accept;",
    ("raw", "PREROUTING"): "type filter hook prerouting priority -300; policy accept;",
    ("raw", "OUTPUT"): "type filter hook output priority -300; policy accept;",
}


def table_name(table: str) -> str:
    return TABLE_PREFIX + table


def cleanup_script() -> str:
    """Remove every table this module can create (no error when absent)."""
    lines = []
    for family in FAMILIES:
        for table in TABLES:
            lines.append(f"add table {family} {table_name(table)}")
            lines.append(f"delete table {family} {table_name(table)}")
    return "".join(f"{line}\n" for line in lines)


def nft_script(ruleset: RuleSet) -> str:
    """The full, idempotent replacement script for both families."""
    parts = [cleanup_script()]
    for family, rules in (("ip", ruleset.v4), ("ip6", ruleset.v6)):
        parts.append(family_script(family, rules))
    return "".join(parts)


def family_script(family: str, rules: Sequence[Rule]) -> str:
    lines: list[str] = []
    for table in TABLES:
        table_rules = [r for r in rules if r.table == table]
        if not table_rules:
            continue
        name = f"{family} {table_name(table)}"
        lines.append(f"add table {name}")
        for chain in _chains(table, table_rules):
            base = BASE_CHAINS.get((table, chain))
            lines.append(f"add chain {name} {chain} {{ {base} }}" if base else f"add chain {name} {chain}")
        for chain, chain_rules in _resolved(table_rules).items():
            for rule in chain_rules:
                lines.append(f"add rule {name} {chain} {translate(rule, family == 'ip6')}")
    return "".join(f"{line}\n" for line in lines)


def _chains(table: str, rules: Sequence[Rule]) -> list[str]:
    """Base chains that are used, then ISTIO chains in declaration order."""
    names: list[str] = []
    for rule in rules:
        for chain in (rule.chain, rule.jump_target):
            if (
                chain
                and chain not in names
                and ((table, chain) in BASE_CHAINS or chain not in BUILTIN_CHAINS_AND_TARGETS)
            ):
                names.append(chain)
    base = [c for c in names if (table, c) in BASE_CHAINS]
    return base + [c for c in names if (table, c) not in BASE_CHAINS]


def _resolved(rules: Sequence[Rule]) -> dict[str, list[Rule]]:
    """Apply appends and inserts in order, as the kernel would, to get each chain's final order."""
    chains: dict[str, list[Rule]] = {}
    for rule in rules:
        chain = chains.setdefault(rule.chain, [])
        if rule.is_insert:
            chain.insert(min(rule.position - 1, len(chain)), rule)
        else:
            chain.append(rule)
    return chains


def _iface(name: str) -> str:
    return f'"{name[:-1]}*"' if name.endswith("+") else f'"{name}"'


def _owner_value(value: str) -> str:
    return value if value.isdigit() else f'"{value}"'


def translate(rule: Rule, v6: bool) -> str:
    """One iptables rule spec as an nftables rule body (raises on anything unexpected)."""
    spec = rule.spec
    out: list[str] = []
    proto = ""
    module = ""
    negate = False
    i = 0
    while i < len(spec):
        token = spec[i]
        value = spec[i + 1] if i + 1 < len(spec) else ""
        op = "!= " if negate else ""
        negate = False
        if token == "!":
            negate = True
            i += 1
            continue
        if token == "-j":
            out.append(_target(spec[i + 1 :]))
            break
        if token == "-p":
            proto = value
            out.append(f"meta l4proto {op}{value}")
        elif token in ("-i", "-o"):
            out.append(f"{'iifname' if token == '-i' else 'oifname'} {op}{_iface(value)}")
        elif token in ("-s", "-d"):
            out.append(f"{'ip6' if v6 else 'ip'} {'saddr' if token == '-s' else 'daddr'} {op}{value}")
        elif token in ("--dport", "--sport") and proto:
            out.append(f"{proto} {token[2:]} {op}{value}")
        elif token == "--dports" and proto:
            out.append(f"{proto} dport {op}{{ {', '.join(value.split(','))} }}")
        elif token == "-m":
            module = value
        elif token in ("--uid-owner", "--gid-owner"):
            out.append(f"meta {'skuid' if token == '--uid-owner' else 'skgid'} {op}{_owner_value(value)}")
        elif token == "--ctstate":
            out.append(f"ct state {op}{value.lower()}")
        elif token == "--mark":
            out.append(f"{'ct' if module == 'connmark' else 'meta'} mark {op}{value}")
        else:
            raise ValueError(f"cannot translate {token!r} in rule {rule.text()!r} to nftables")
        i += 2
    return " ".join(out)


def _target(target: Sequence[str]) -> str:
    name, args = target[0], list(target[1:])
    simple = {"RETURN": "return", "ACCEPT": "accept", "DROP": "drop"}
    if name in simple and not args:
        return simple[name]
    if name.startswith("ISTIO_") and not args:
        return f"jump {name}"
    if name == "REDIRECT" and len(args) == 2 and args[0] in ("--to-ports", "--to-port"):
        return f"redirect to :{args[1]}"
    if name == "TPROXY" and len(args) == 4 and args[0] == "--tproxy-mark" and args[2] == "--on-port":
        mark = args[1].split("/")[0]
        return f"tproxy to :{args[3]} meta mark set {mark} accept"
    if name == "MARK" and len(args) == 2 and args[0] == "--set-mark":
        return f"meta mark set {args[1]}"
    if name == "CONNMARK" and args == ["--save-mark"]:
        return "ct mark set meta mark"
    if name == "CONNMARK" and args == ["--restore-mark"]:
        return "meta mark set ct mark"
    if name == "CT" and len(args) == 2 and args[0] == "--zone":
        return f"ct zone set {args[1]}"
    raise ValueError(f"cannot translate target {' '.join(target)!r} to nftables")
