"""Upstream Istio's DNS proxy test table (pkg/dns/client/dns_test.go), restated as data.

No tests here: tests/component/test_dns_upstream_cases.py runs `CASES`
against the real proxy over UDP and TCP, and tests/unit/test_dns_upstream_rules.py
checks `ALT_HOSTS` on the pure name table. Everything is restated from
upstream's table: the NameTable of its `fillTable`, the proxy's namespace,
domain and search list of its `initDNS`, and its `makeUpstream` resolver
stand-in, whose decisions `standin_reply()` makes here (pure: bytes in,
bytes or None out).

Where upstream's expected answer depends on its test hooking Go's random
query-id source (the round-robin order of `details.ns2.svc.cluster.remote.`
for ids 1 and 2), the case keeps the records and `ordered=False`: upstream
shuffles with fresh random ids, so no client can rely on an order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from istio_agent.protos import nds_pb2

# initDNS: NewLocalDNSServer("ns1", "ns1.svc.cluster.local", ...); fillTable sets the search list.
NAMESPACE = "ns1"
DOMAIN = "ns1.svc.cluster.local"
SEARCH = ("ns1.svc.cluster.local", "svc.cluster.local", "cluster.local")
TTL = 30  # upstream's a()/aaaa()/cname() helpers, for local answers and the stand-in's alike

V6 = "2001:db8::ff00:42:8329"  # 2001:db8:0:0:0:ff00:42:8329


def name_table() -> nds_pb2.NameTable:
    """fillTable's NameTable."""
    entries = {
        "www.google.com": dict(ips=["1.1.1.1"], registry="External"),
        "productpage.ns1.svc.cluster.local": dict(ips=["9.9.9.9"], registry="Kubernetes", namespace="ns1",
                                                  shortname="productpage"),
        "example.ns2.svc.cluster.local": dict(ips=["10.10.10.10"], registry="Kubernetes", namespace="ns2",
                                              shortname="example"),
        "details.ns2.svc.cluster.remote": dict(ips=["11.11.11.11", "12.12.12.12", "13.13.13.13", "14.14.14.14"],
                                               registry="Kubernetes", namespace="ns2", shortname="details"),
        "svc-with-alt.ns1.svc.cluster.local": dict(ips=["15.15.15.15"], registry="Kubernetes", namespace="ns1",
                                                   shortname="svc-with-alt",
                                                   alt_hosts=["svc-with-alt.ns1.svc.clusterset.local"]),
        "ipv6.localhost": dict(ips=["2001:db8:0:0:0:ff00:42:8329"], registry="External"),
        "dual.localhost": dict(ips=["2.2.2.2", "2001:db8:0:0:0:ff00:42:8329"], registry="External"),
        "ipv4.localhost": dict(ips=["2.2.2.2"], registry="External"),
        "*.b.wildcard": dict(ips=["11.11.11.11"], registry="External"),
        "*.wildcard": dict(ips=["10.10.10.10"], registry="External"),
        "*.svc.mesh.company.net": dict(ips=["10.1.2.3"], registry="External"),
        "example.localhost.": dict(ips=["3.3.3.3"], registry="External"),
    }
    nt = nds_pb2.NameTable()
    for host, entry in entries.items():
        nt.table[host].CopyFrom(nds_pb2.NameInfo(**entry))  # type: ignore[arg-type]
    return nt


# TestBuildAlternateHosts: the names (among all entries' alternate hosts, not the CNAMEs) that start
# with each prefix. Upstream's sets also hold the NameTable's own keys without the trailing dot,
# which it adds back into the table it inspects; those are not names a query can carry, so they are
# left out here.
ALT_HOSTS: dict[str, set[str]] = {
    "www.google.com": {"www.google.com."},
    "example": {"example.ns2.", "example.ns2.svc.", "example.localhost.", "example.ns2.svc.cluster.local."},
    "details": {"details.ns2.svc.cluster.remote."},
    "productpage": {"productpage.ns1.svc.cluster.local.", "productpage.", "productpage.ns1.",
                    "productpage.ns1.svc."},
    "svc-with-alt": {"svc-with-alt.", "svc-with-alt.ns1.", "svc-with-alt.ns1.svc.",
                     "svc-with-alt.ns1.svc.clusterset.local.", "svc-with-alt.ns1.svc.cluster.local."},
    "*.wildcard": {"*.wildcard."},
    "example.localhost.": {"example.localhost."},
}

Rr = tuple[str, str, str]  # (owner, type, rdata) as dnspython writes them


def a(owner: str, *ips: str) -> list[Rr]:
    return [(owner, "A", ip) for ip in ips]


def aaaa(owner: str, *ips: str) -> list[Rr]:
    return [(owner, "AAAA", ip) for ip in ips]


def cname(owner: str, target: str) -> list[Rr]:
    return [(owner, "CNAME", target)]


GIANT_OWNER = "aaaaaaaaaaaa.aaaaaa."
GIANT_IPS = [f"240.0.0.{i}" for i in range(64)]
GIANT = a(GIANT_OWNER, *GIANT_IPS)
GIANT_TC_KEPT = 29  # of GIANT's records fit 512 bytes (compressed) after giant-tc.'s question


@dataclass(frozen=True)
class Case:
    """One row of upstream's testDNS table.

    `rcode` is what the client must get (upstream checks it only where it set
    expectResolutionFailure; every row's is restated); `forwarded` whether the
    query must reach the upstream resolver (the stand-in logs what it sees);
    `transport` limits a row to "udp" or "tcp", as upstream's name prefix does.
    """

    name: str
    host: str
    expected: list[Rr] = field(default_factory=list)
    qtype: str = "A"
    rcode: dns.rcode.Rcode = dns.rcode.NOERROR
    forwarded: bool = False
    transport: str | None = None
    qid: int | None = None
    edns_payload: int | None = None  # modifyReq: msg.SetEdns0(size, false)
    ordered: bool = True
    truncated: bool = False

    @property
    def local(self) -> bool:
        return not self.forwarded


NXDOMAIN = dns.rcode.NXDOMAIN
DETAILS = "details.ns2.svc.cluster.remote."

CASES: list[Case] = [
    Case("success: non k8s host in local cache", "www.google.com.", a("www.google.com.", "1.1.1.1")),
    Case("success: non k8s host with search namespace yields cname+A record", "www.google.com.ns1.svc.cluster.local.",
         cname("www.google.com.ns1.svc.cluster.local.", "www.google.com.") + a("www.google.com.", "1.1.1.1")),
    # expectExternalResolution: the stand-in knows it (makeUpstream's responses map)
    Case("success: non k8s host not in local cache", "www.bing.com.", a("www.bing.com.", "1.1.1.1"), forwarded=True),
    Case("success: k8s host - fqdn", "productpage.ns1.svc.cluster.local.",
         a("productpage.ns1.svc.cluster.local.", "9.9.9.9")),
    # Ends in the first search domain: never expanded, so not ours; the stand-in says NXDOMAIN.
    Case("not found: k8s host, fqdn with search namespace[0]",
         "productpage.ns1.svc.cluster.local.ns1.svc.cluster.local.", rcode=NXDOMAIN, forwarded=True),
    Case("success: k8s host - name.namespace", "productpage.ns1.", a("productpage.ns1.", "9.9.9.9")),
    Case("success: k8s host - shortname", "productpage.", a("productpage.", "9.9.9.9")),
    Case("success: k8s host (name.namespace) with search namespace yields cname+A record",
         "productpage.ns1.ns1.svc.cluster.local.",
         cname("productpage.ns1.ns1.svc.cluster.local.", "productpage.ns1.") + a("productpage.ns1.", "9.9.9.9")),
    Case("success: AAAA query for IPv4 k8s host (name.namespace) with search namespace",
         "productpage.ns1.ns1.svc.cluster.local.", qtype="AAAA"),
    Case("success: k8s host - non local namespace - name.namespace", "example.ns2.",
         a("example.ns2.", "10.10.10.10")),
    Case("success: k8s host - non local namespace - fqdn", "example.ns2.svc.cluster.local.",
         a("example.ns2.svc.cluster.local.", "10.10.10.10")),
    Case("success: k8s host - non local namespace - name.namespace.svc", "example.ns2.svc.",
         a("example.ns2.svc.", "10.10.10.10")),
    Case("failure: k8s host - non local namespace - shortname", "example.", rcode=NXDOMAIN, forwarded=True),
    Case("success: alt host - name", "svc-with-alt.", a("svc-with-alt.", "15.15.15.15")),
    Case("success: alt host - name.namespace", "svc-with-alt.ns1.", a("svc-with-alt.ns1.", "15.15.15.15")),
    Case("success: alt host - name.namespace.svc", "svc-with-alt.ns1.svc.",
         a("svc-with-alt.ns1.svc.", "15.15.15.15")),
    Case("success: alt host - name.namespace.svc.cluster.local", "svc-with-alt.ns1.svc.cluster.local.",
         a("svc-with-alt.ns1.svc.cluster.local.", "15.15.15.15")),
    Case("success: alt host - name.namespace.svc.clusterset.local", "svc-with-alt.ns1.svc.clusterset.local.",
         a("svc-with-alt.ns1.svc.clusterset.local.", "15.15.15.15")),
    Case("success: remote cluster k8s svc - same ns and different domain - fqdn", DETAILS,
         a(DETAILS, "13.13.13.13", "14.14.14.14", "12.12.12.12", "11.11.11.11"), qid=2, ordered=False),
    Case("success: remote cluster k8s svc round robin", DETAILS,
         a(DETAILS, "13.13.13.13", "14.14.14.14", "11.11.11.11", "12.12.12.12"), qid=1, ordered=False),
    Case("failure: remote cluster k8s svc - same ns and different domain - name.namespace", "details.ns2.",
         rcode=NXDOMAIN, forwarded=True),
    Case("success: TypeA query returns A records only", "dual.localhost.", a("dual.localhost.", "2.2.2.2")),
    Case("success: wild card returns A record correctly", "foo.wildcard.", a("foo.wildcard.", "10.10.10.10")),
    Case("success: specific wild card returns A record correctly", "a.b.wildcard.",
         a("a.b.wildcard.", "11.11.11.11")),
    Case("success: wild card with with search namespace chained pointer correctly",
         "foo.wildcard.ns1.svc.cluster.local.",
         cname("foo.wildcard.ns1.svc.cluster.local.", "*.wildcard.") + a("*.wildcard.", "10.10.10.10")),
    Case("success: wild card with domain returns A record correctly", "foo.svc.mesh.company.net.",
         a("foo.svc.mesh.company.net.", "10.1.2.3")),
    Case("success: wild card with namespace with domain returns A record correctly",
         "foo.foons.svc.mesh.company.net.", a("foo.foons.svc.mesh.company.net.", "10.1.2.3")),
    Case("success: wild card with search domain returns A record correctly",
         "foo.svc.mesh.company.net.ns1.svc.cluster.local.",
         cname("foo.svc.mesh.company.net.ns1.svc.cluster.local.", "*.svc.mesh.company.net.")
         + a("*.svc.mesh.company.net.", "10.1.2.3")),
    Case("success: TypeAAAA query returns AAAA records only", "dual.localhost.", aaaa("dual.localhost.", V6),
         qtype="AAAA"),
    # Not NXDOMAIN: NOERROR without records.
    Case("success: Error response if only AAAA records exist for typeA", "ipv6.localhost."),
    Case("success: Error response if only A records exist for typeAAAA", "ipv4.localhost.", qtype="AAAA"),
    # The stand-in sends the whole answer whatever the query allows: upstream's client cannot read it.
    Case("udp: large request", "giant.", rcode=dns.rcode.SERVFAIL, forwarded=True, transport="udp"),
    Case("tcp: large request", "giant.", GIANT, forwarded=True, transport="tcp"),
    Case("large request edns", "giant.", GIANT, forwarded=True, edns_payload=65535),
    # The stand-in truncates for UDP (also when asked over TCP), which is passed on as is.
    Case("large request truncated", "giant-tc.", GIANT[:GIANT_TC_KEPT], forwarded=True, truncated=True),
    Case("success: hostname with a period", "example.localhost.", a("example.localhost.", "3.3.3.3")),
]

# Not rows of upstream's table, but what its code does with the same table: case, other types,
# a query with no question (upstream's `len(req.Question) == 0` branch).
CASE_CASES: list[Case] = [
    Case("case: upper-case fqdn, lower-case owners", "PRODUCTPAGE.NS1.SVC.CLUSTER.LOCAL.",
         a("productpage.ns1.svc.cluster.local.", "9.9.9.9")),
    Case("case: mixed-case search expansion", "WWW.Google.Com.NS1.svc.cluster.local.",
         cname("www.google.com.ns1.svc.cluster.local.", "www.google.com.") + a("www.google.com.", "1.1.1.1")),
    Case("case: mixed-case wildcard", "Foo.B.WildCard.", a("foo.b.wildcard.", "11.11.11.11")),
    Case("case: mixed-case wildcard expansion", "X.WILDCARD.ns1.svc.cluster.local.",
         cname("x.wildcard.ns1.svc.cluster.local.", "*.wildcard.") + a("*.wildcard.", "10.10.10.10")),
    Case("case: shortname AAAA for an IPv4 service", "ProductPage.", qtype="AAAA"),
    Case("type: TXT for a known host goes upstream", "productpage.ns1.", qtype="TXT", rcode=NXDOMAIN,
         forwarded=True),
    Case("type: expansion of the second search domain is not ours", "www.google.com.svc.cluster.local.",
         rcode=NXDOMAIN, forwarded=True),
]


# ---- makeUpstream's resolver, as decisions -------------------------------------------------

STANDIN_ZONES = ("www.bing.com.", "giant.", "giant-tc.")  # its handlers besides "."


def _zone(qname: dns.name.Name) -> str:
    """The most specific handler miekg's ServeMux picks: the longest zone at or above the name."""
    best = "."
    for zone in STANDIN_ZONES:
        if qname.is_subdomain(dns.name.from_text(zone)) and len(zone) > len(best):
            best = zone
    return best


def _reply(query: dns.message.Message, rcode: dns.rcode.Rcode) -> dns.message.Message:
    """miekg's SetReply: id, QR, opcode, RD and CD copied, the first question; no EDNS, no RA."""
    resp = dns.message.Message(id=query.id)
    resp.flags = dns.flags.QR | (query.flags & (dns.flags.RD | dns.flags.CD))
    resp.set_opcode(query.opcode())
    resp.question = list(query.question[:1])
    resp.set_rcode(rcode)
    return resp


def _with_records(resp: dns.message.Message, records: list[Rr], limit: int | None) -> bytes:
    """Wire form with as many leading records as fit `limit` (TC set when some are cut), like Truncate."""
    for kept in range(len(records), -1, -1):
        resp.answer = [dns.rrset.from_text(owner, TTL, "IN", rtype, data) for owner, rtype, data in records[:kept]]
        if kept < len(records):
            resp.flags |= dns.flags.TC
        out = resp.to_wire(max_size=65535)
        if limit is None or len(out) <= limit:
            return out
    raise AssertionError("not even the header fits")


def standin_reply(data: bytes) -> bytes | None:
    """The stand-in's reply to one query (the same over UDP and TCP), None to ignore it."""
    try:
        query = dns.message.from_wire(data)
    except Exception:
        return None
    if query.flags & dns.flags.QR or not query.question:
        return None
    zone = _zone(query.question[0].name)
    if zone == ".":
        return _reply(query, dns.rcode.NXDOMAIN).to_wire()
    resp = _reply(query, dns.rcode.NOERROR)
    if zone == "www.bing.com.":
        return _with_records(resp, a(zone, "1.1.1.1"), None)  # an A record whatever the type asked
    if zone == "giant.":
        return _with_records(resp, GIANT, None)
    # giant-tc.: answer.Truncate(size("udp", msg)): the query's EDNS size, at least 512
    limit = max(512, query.payload) if query.edns >= 0 else 512
    return _with_records(resp, GIANT, limit)
