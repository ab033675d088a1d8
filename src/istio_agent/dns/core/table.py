"""From a NameTable to the names the proxy answers, with upstream Istio's rules.

Upstream (pkg/dns/client) builds, per NameTable entry, a set of names:
the host itself (a trailing dot added); for a Kubernetes service whose host
ends in the proxy's cluster domain also `name.ns.`, `name.ns.svc.` (the
domain's first label), `name.` when it is in the proxy's own namespace, and
the entry's `alt_hosts`. A Kubernetes host that already ends in a dot gets no
names at all. Each name is lower-cased and, unless it ends in the first
`resolv.conf` search domain, also answers expanded with that domain, by a
CNAME back to the name (the stub resolver tries that expansion first, so
one answer short-circuits the search list); an expansion that is itself one
of the entry's names is not added. So `productpage.ns1.svc.cluster.local.ns1.
svc.cluster.local.` is not ours and goes upstream, as it does upstream.

Lookups follow upstream's order: an exact name, else the most specific
`*.suffix` covering the query; a name that is an expansion answers with the
CNAME even if some entry also offers it as a host; the addresses come from
the one name the CNAME points at. A and AAAA are kept per name separately, as
upstream's two maps are, so one entry's IPv4 and another's IPv6 for the same
name both answer. A known name lacking the asked family is NOERROR with no
records; other types are not ours.

Upstream keys all this by presentation strings (miekg/dns's escaped form);
we key it by the equivalent lower-cased wire names, and a table name that is
not a canonical presentation string (it could never equal a query's) is
dropped. Where upstream leaves an outcome to Go's random map order (two
entries offering the same name and family, or the same expansion), we decide
deterministically: the entry whose own host it is beats an alias, Kubernetes
beats other registries, then the lexically smaller host.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from istio_agent.dns.core import wire
from istio_agent.protos import nds_pb2

KUBERNETES = "Kubernetes"  # provider.Kubernetes: the only registry with short names
TTL = 30  # seconds; kept low so clients pick up new addresses quickly
_WILDCARD = b"\x01*"

Rank = tuple[bool, bool, str]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Record:
    """One answer record: lower-case wire owner, type, and packed address or CNAME target (wire)."""

    owner: bytes
    rtype: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Lookup:
    """Every name the proxy answers for (wire, lower case), before it is packed into wire answers."""

    v4: dict[bytes, tuple[bytes, ...]]
    v6: dict[bytes, tuple[bytes, ...]]
    cnames: dict[bytes, bytes]  # search-expanded name -> the name it expands
    wildcards: frozenset[bytes]  # the `*.x` names among all of them

    def __contains__(self, name: object) -> bool:
        """`name` is one of the table's names (upstream's allHosts). Three dict probes instead of a set of
        every name: that set cost about 85 bytes a name (0.5 MB for 1,000 services), and only a
        question the compiled answers do not hold asks."""
        return name in self.v4 or name in self.v6 or name in self.cnames

    @property
    def names(self) -> frozenset[bytes]:
        """Every name (upstream's allHosts), built on demand (tests, debugging)."""
        return frozenset((*self.v4, *self.v6, *self.cnames))

    def hosts(self) -> list[bytes]:
        """Names answered with addresses directly (not through a CNAME)."""
        cnames = self.cnames
        return [name for name in dict.fromkeys((*self.v4, *self.v6)) if name not in cnames]


def go_lower(text: str) -> str:
    """Go's strings.ToLower: per character simple case mapping (Python's str.lower differs on U+0130)."""
    if text.isascii():
        return text.lower()
    return "".join("i" if ch == "\u0130" else ch.lower() for ch in text)


def proxy_domain(namespace: str, domain: str) -> str:
    """The cluster domain part of the proxy's `--domain` (`ns.svc.cluster.local` -> `svc.cluster.local`)."""
    parts = domain.split(".")
    if parts[0] == namespace:
        parts = parts[1:]
    return ".".join(parts)


def alt_hosts(hostname: str, info: nds_pb2.NameInfo, namespace: str, domain: str) -> list[str]:
    """The names one NameTable entry answers to, as upstream spells them (case kept, trailing dot).

    `domain` is the cluster domain without the namespace (see proxy_domain()).
    """
    if info.registry != KUBERNETES:
        return [hostname if hostname.endswith(".") else hostname + "."]
    if hostname.endswith("."):
        return []
    out = [hostname + "."]
    # Short forms only for services in the proxy's own cluster domain: across domains
    # `name.ns` would be ambiguous.
    if not domain or not hostname.endswith(domain):
        return out
    out.append(f"{info.shortname}.{info.namespace}.")
    if info.namespace == namespace:
        out.append(f"{info.shortname}.")
    out.append(f"{info.shortname}.{info.namespace}.{domain.split('.')[0]}.")
    out.extend(alt + "." for alt in info.alt_hosts)
    return list(dict.fromkeys(out))


def split_ips(ips: Iterable[str]) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """Packed IPv4 and IPv6 addresses in table order, skipping what Go's netip.ParseAddr rejects."""
    v4: list[bytes] = []
    v6: list[bytes] = []
    for text in ips:
        try:
            addr = ipaddress.ip_address(text)
        except ValueError:
            continue
        (v4 if addr.version == 4 else v6).append(addr.packed)
    return tuple(v4), tuple(v6)


class _Builder:
    """Collects each name's best offer per family and per expansion while entries are walked."""

    def __init__(self, search: Sequence[str]) -> None:
        first = search[0] if search else ""
        self.first = first
        # What upstream appends, lower-cased ("" when there is no search list). A host ends in an
        # unescaped dot, so the expansion is canonical exactly when this part is, on its own, and
        # its wire form is the host's without the root label followed by this part's.
        self.suffix = go_lower(first) + ("" if first.endswith(".") else ".") if first else ""
        suffix_wire = wire.name_from_text(self.suffix) if self.suffix not in ("", ".") else None
        self.suffix_wire = suffix_wire
        self.v4: dict[bytes, tuple[Rank, tuple[bytes, ...]]] = {}
        self.v6: dict[bytes, tuple[Rank, tuple[bytes, ...]]] = {}
        self.cnames: dict[bytes, tuple[Rank, bytes]] = {}

    def add_entry(self, hostname: str, info: nds_pb2.NameInfo, names: list[str],
                  v4: tuple[bytes, ...], v6: tuple[bytes, ...]) -> None:
        own = go_lower(hostname if hostname.endswith(".") else hostname + ".")
        kube = info.registry == KUBERNETES
        ends_search = self.first + "."
        suffix, suffix_wire = self.suffix, self.suffix_wire
        for spelled in names:
            host = go_lower(spelled)
            rank = (host != own, not kube, hostname)
            name = wire.name_from_text(host)
            if name is None:
                continue  # no query can ever spell it
            if v4:
                _offer(self.v4, name, rank, v4)
            if v6:
                _offer(self.v6, name, rank, v6)
            if suffix_wire is None or host.endswith(ends_search) or name == b"\x00":
                continue  # (the root's expansion would start with an empty label: no name)
            # Upstream compares the expansion with the entry's names as spelled, before lower-casing.
            if len(names) > 1 and host + suffix in names:
                continue
            expanded = name[:-1] + suffix_wire
            if len(expanded) <= 255:
                _offer(self.cnames, expanded, rank, name)

    def lookup(self) -> Lookup:
        v4 = {name: addrs for name, (_, addrs) in self.v4.items()}
        v6 = {name: addrs for name, (_, addrs) in self.v6.items()}
        cnames = {name: target for name, (_, target) in self.cnames.items()}
        wildcards = frozenset(name for name in (*v4, *v6, *cnames) if name.startswith(_WILDCARD))
        return Lookup(v4=v4, v6=v6, cnames=cnames, wildcards=wildcards)


def _offer(best: dict[bytes, tuple[Rank, T]], name: bytes, rank: Rank, value: T) -> None:
    current = best.get(name)
    if current is None or rank < current[0]:
        best[name] = (rank, value)


def build_lookup(table: nds_pb2.NameTable, namespace: str, domain: str, search: Sequence[str]) -> Lookup:
    """Resolve a NameTable into the per-family address maps and the search-domain CNAMEs.

    `domain` is the cluster domain without the namespace (see proxy_domain());
    `search` the resolv.conf search list as read (only its first entry counts).
    """
    builder = _Builder(search)
    for hostname, info in table.table.items():
        names = alt_hosts(hostname, info, namespace, domain)
        v4, v6 = split_ips(info.ips)
        if not v4 and not v6:
            continue  # no usable address: not ours, let upstream DNS answer it
        builder.add_entry(hostname, info, names, v4, v6)
    return builder.lookup()


def match(lookup: Lookup, qname: bytes) -> bytes | None:
    """The table name that answers a lower-case wire qname: itself, or the most specific `*.suffix`.

    As upstream: the wildcard search starts below the first label and never
    tries the bare root wildcard. Working on wire labels keeps a label that
    contains a dot from being taken for two.
    """
    if qname in lookup:
        return qname
    wildcards = lookup.wildcards
    if wildcards:
        off = 0
        while qname[off]:
            off += 1 + qname[off]
            if qname[off]:
                candidate = _WILDCARD + qname[off:]
                if candidate in wildcards:
                    return candidate
    return None


def records(lookup: Lookup, qname: bytes, name: bytes, qtype: int) -> list[Record] | None:
    """Answer records for qname matched to table name `name`; None when the type is not ours.

    An empty list means NOERROR without records (a known name lacking the asked
    family). Owners are lower case, as upstream writes them.
    """
    if qtype == wire.TYPE_A:
        family = lookup.v4
    elif qtype == wire.TYPE_AAAA:
        family = lookup.v6
    else:
        return None
    target = lookup.cnames.get(name)
    if target is None:
        # Also for a wildcard: the records are owned by the question itself.
        return [Record(qname, qtype, addr) for addr in family.get(name, ())]
    addresses = family.get(target, ())
    if not addresses:
        return []  # upstream drops the CNAME too when the target lacks the family
    # After a CNAME the addresses are owned by its target (for a wildcard, the `*.x` name).
    return [Record(qname, wire.TYPE_CNAME, target), *(Record(target, qtype, addr) for addr in addresses)]


def resolve(lookup: Lookup, qname: bytes, qtype: int) -> list[Record] | None:
    """Answer records for a lower-case wire qname, or None when it is not ours."""
    name = match(lookup, qname)
    if name is None:
        return None
    return records(lookup, qname, name, qtype)
