"""From a NameTable to the names the proxy answers, with upstream Istio's rules.

Upstream (pkg/dns/client) answers every NameTable host by its own name, and a
Kubernetes service host inside the proxy's cluster domain also as
`name.ns.`, `name.ns.svc.` and, for the proxy's own namespace, `name.`, plus the
entry's `alt_hosts`. Every such name expanded with the first `resolv.conf`
search domain answers with a CNAME back to the name (the stub resolver tries
that expansion first, so one answer short-circuits the search list).
Wildcard hosts `*.x` answer any name below `x`, the most specific wildcard
winning. A/AAAA come from the entry's IPs; a name we know but without the asked
family gets NOERROR with no records; other types are not ours.

Where upstream leaves an outcome to Go's random map order (two entries offering
the same name), we decide deterministically, as upstream's newer name index
does: the entry whose own host it is beats an alias, Kubernetes beats other
registries, then the lexically smaller host; a search-expanded CNAME never
shadows a name that some entry offers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from istio_agent.dns import wire
from istio_agent.protos import nds_pb2

KUBERNETES = "Kubernetes"  # provider.Kubernetes: the only registry with short names
TTL = 30  # seconds; kept low so clients pick up new addresses quickly


@dataclass(frozen=True, slots=True)
class Host:
    """Addresses of one answerable name (lower case, trailing dot)."""

    name: str
    v4: tuple[bytes, ...]
    v6: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Record:
    """One answer record: owner, type and either packed address or CNAME target."""

    owner: str
    rtype: int
    data: bytes | str


@dataclass(slots=True)
class Lookup:
    """Every name the proxy answers for, before it is packed into wire answers."""

    hosts: dict[str, Host] = field(default_factory=dict)
    cnames: dict[str, str] = field(default_factory=dict)  # search-expanded name -> host name
    wires: dict[str, bytes] = field(default_factory=dict)  # every name above -> its wire form

    def wildcards(self) -> list[str]:
        """The `*.x` names, which cannot be enumerated into exact answers."""
        return [name for name in (*self.hosts, *self.cnames) if name.startswith("*.")]


def proxy_domain(namespace: str, domain: str) -> str:
    """The cluster domain part of the proxy's `--domain` (`ns.svc.cluster.local` -> `svc.cluster.local`)."""
    parts = domain.strip(".").split(".") if domain.strip(".") else []
    if parts and parts[0] == namespace:
        parts = parts[1:]
    return ".".join(parts)


def alt_hosts(hostname: str, info: nds_pb2.NameInfo, namespace: str, domain: str) -> list[str]:
    """All names (lower case, trailing dot) one NameTable entry answers to."""
    fqdn = hostname.lower().rstrip(".") + "."
    if info.registry != KUBERNETES:
        return [fqdn]
    out = [fqdn]
    # Short forms only for services in the proxy's own cluster domain: across domains
    # `name.ns` would be ambiguous.
    if not domain or not hostname.rstrip(".").endswith(domain):
        return out
    short = f"{info.shortname}.{info.namespace}".lower()
    out.append(short + ".")
    if info.namespace == namespace:
        out.append(info.shortname.lower() + ".")
    out.append(f"{short}.{domain.split('.')[0].lower()}.")
    out.extend(alt.lower().rstrip(".") + "." for alt in info.alt_hosts)
    return list(dict.fromkeys(out))


def split_ips(ips: Iterable[str]) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """Packed IPv4 and IPv6 addresses, skipping anything unparsable (upstream does the same)."""
    v4: list[bytes] = []
    v6: list[bytes] = []
    for text in ips:
        try:
            addr = ipaddress.ip_address(text.strip())
        except ValueError:
            continue
        (v4 if addr.version == 4 else v6).append(addr.packed)
    return tuple(v4), tuple(v6)


def build_lookup(table: nds_pb2.NameTable, namespace: str, domain: str, search: Sequence[str]) -> Lookup:
    """Resolve a NameTable into the final name -> addresses map and the search-domain CNAMEs.

    `domain` is the cluster domain without the namespace (see proxy_domain()).
    """
    best: dict[str, tuple[tuple[bool, bool, str], Host]] = {}
    wires: dict[str, bytes] = {}
    for hostname, info in table.table.items():
        v4, v6 = split_ips(info.ips)
        if not v4 and not v6:
            continue  # no usable address: not ours, let upstream DNS answer it
        own = hostname.lower().rstrip(".") + "."
        kube = info.registry == KUBERNETES
        for name in alt_hosts(hostname, info, namespace, domain):
            if name not in wires and not _encode_into(wires, name):
                continue
            rank = (name != own, not kube, hostname)
            current = best.get(name)
            if current is None or rank < current[0]:
                best[name] = (rank, Host(name, v4, v6))
    lookup = Lookup(hosts={name: host for name, (_, host) in best.items()})
    first = next((s.strip(".").lower() for s in search if s.strip(".")), "")
    if first:
        suffix = wire.encode_name(first)
        for name in lookup.hosts:
            expanded = f"{name}{first}."
            candidate = wires[name][:-1] + suffix
            if expanded not in lookup.hosts and len(candidate) <= 255:
                lookup.cnames[expanded] = name
                wires[expanded] = candidate
    lookup.wires = {name: wires[name] for name in (*lookup.hosts, *lookup.cnames)}
    return lookup


def _encode_into(wires: dict[str, bytes], name: str) -> bool:
    try:
        wires[name] = wire.encode_name(name)
    except ValueError:
        return False
    return True


def match(lookup: Lookup, qname: str) -> str | None:
    """The table name that answers qname: itself, or the most specific `*.suffix` covering it.

    Matches upstream: the wildcard search starts below the first label and never
    tries the bare root wildcard.
    """
    if qname in lookup.hosts or qname in lookup.cnames:
        return qname
    labels = qname.rstrip(".").split(".")
    for idx in range(1, len(labels)):
        candidate = "*." + ".".join(labels[idx:]) + "."
        if candidate in lookup.hosts or candidate in lookup.cnames:
            return candidate
    return None


def records(lookup: Lookup, qname: str, name: str, qtype: int) -> list[Record] | None:
    """Answer records for qname matched to table name `name`; None when the type is not ours.

    An empty list means NOERROR without records (a known name lacking the asked family).
    """
    if qtype not in (wire.TYPE_A, wire.TYPE_AAAA):
        return None
    chain: list[Record] = []
    target = lookup.cnames.get(name)
    if target is not None:
        chain.append(Record(qname, wire.TYPE_CNAME, target))
        name = target
    host = lookup.hosts.get(name)
    addresses = () if host is None else (host.v4 if qtype == wire.TYPE_A else host.v6)
    if not addresses:
        return []  # upstream drops the CNAME too when the target lacks the family
    # Without a CNAME the address records are owned by the question itself (also for a
    # wildcard); after one, by the CNAME target (which for a wildcard is the `*.x` name).
    owner = name if chain else qname
    return chain + [Record(owner, qtype, addr) for addr in addresses]


def resolve(lookup: Lookup, qname: str, qtype: int) -> list[Record] | None:
    """Answer records for a lower-case qname (trailing dot), or None when it is not ours."""
    name = match(lookup, qname)
    if name is None:
        return None
    return records(lookup, qname, name, qtype)
