"""Upstream's naming rules (pkg/dns/client/dns.go), sans-IO: the name table, presentation form, the responder.

The table rows of tests/dns_upstream_table.py run here through the pure
Responder too (the component test runs them over real sockets); the rest
pins the rules behind them one at a time, each against upstream's code:
which names an entry gets, which are expanded with the search domain, how
conflicts and families combine, and which spellings can match at all.
"""

from __future__ import annotations

import random

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import pytest
from dns_upstream_table import ALT_HOSTS, CASE_CASES, CASES, DOMAIN, NAMESPACE, SEARCH, Case, name_table
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dns_support import asks_upstream, counts, info, query

from istio_agent.dns.core import wire
from istio_agent.dns.core.answers import CompiledTable
from istio_agent.dns.core.responder import Responder
from istio_agent.dns.core.table import Lookup, alt_hosts, build_lookup, go_lower, proxy_domain, resolve, split_ips
from istio_agent.dns.forward import _UdpUpstream
from istio_agent.protos import nds_pb2


def _lookup(nt: nds_pb2.NameTable, search: tuple[str, ...] = SEARCH, namespace: str = NAMESPACE,
            domain: str = DOMAIN) -> Lookup:
    return build_lookup(nt, namespace, proxy_domain(namespace, domain), search)


def _responder(nt: nds_pb2.NameTable, search: tuple[str, ...] = SEARCH, namespace: str = NAMESPACE,
               domain: str = DOMAIN) -> Responder:
    r = Responder()
    r.table = CompiledTable(nt, build_lookup(nt, namespace, proxy_domain(namespace, domain), search), seed=1)
    return r


def _answers(out: object) -> list[tuple[str, str, str]]:
    assert isinstance(out, bytes), out
    msg = dns.message.from_wire(out, one_rr_per_rrset=True)
    return [(rrset.name.to_text(), dns.rdatatype.to_text(rrset.rdtype), rd.to_text())
            for rrset in msg.answer for rd in rrset]


def _table(entries: dict[str, nds_pb2.NameInfo]) -> nds_pb2.NameTable:
    nt = nds_pb2.NameTable()
    for host, entry in entries.items():
        nt.table[host].CopyFrom(entry)
    return nt


# ---- upstream's table, through the pure responder ---------------------------------------

UPSTREAM = _responder(name_table())


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
@pytest.mark.parametrize("case", [c for c in CASES + CASE_CASES if c.local], ids=lambda c: c.name)
def test_local_rows_answer_as_upstream(case: Case, tcp: bool) -> None:
    q = dns.message.make_query(case.host, case.qtype)
    if case.qid is not None:
        q.id = case.qid
    out = UPSTREAM.respond(q.to_wire(), tcp, counts())
    msg = dns.message.from_wire(out)  # type: ignore[arg-type]
    assert msg.rcode() == case.rcode and msg.flags & dns.flags.AA
    got = _answers(out)
    assert (got if case.ordered else sorted(got)) == (case.expected if case.ordered else sorted(case.expected))


@pytest.mark.parametrize("case", [c for c in CASES + CASE_CASES if c.forwarded], ids=lambda c: c.name)
def test_forwarded_rows_ask_upstream(case: Case) -> None:
    q = dns.message.make_query(case.host, case.qtype)
    assert asks_upstream(UPSTREAM.respond(q.to_wire(), False, counts()))


@pytest.mark.parametrize("prefix", sorted(ALT_HOSTS))
def test_build_alternate_hosts(prefix: str) -> None:
    """TestBuildAlternateHosts: the names each entry answers by (not the search expansions)."""
    lookup = _lookup(name_table())
    names = {wire.name_to_text(name) for name in lookup.hosts()}
    assert {n for n in names if n.startswith(prefix)} == ALT_HOSTS[prefix]


# ---- which names an entry gets -----------------------------------------------------------

def test_kubernetes_host_ending_in_a_dot_gets_no_names() -> None:
    kube = info(["1.2.3.4"], "Kubernetes", "a", "ns1")
    assert alt_hosts("a.ns1.svc.cluster.local.", kube, "ns1", "svc.cluster.local") == []
    assert alt_hosts("a.example.", info(["1.2.3.4"]), "ns1", "svc.cluster.local") == ["a.example."]
    r = _responder(_table({"a.ns1.svc.cluster.local.": kube}))
    for name in ("a.ns1.svc.cluster.local.", "a.", "a.ns1."):
        assert asks_upstream(r.respond(query(name), False, counts()))


def test_short_forms_need_the_domain_as_a_string_suffix() -> None:
    kube = info(["1.2.3.4"], "Kubernetes", "a", "ns2")
    # a plain string suffix, as Go's strings.HasSuffix, not a label boundary
    assert "a.ns2." in alt_hosts("a.ns2.xsvc.cluster.local", kube, "ns1", "svc.cluster.local")
    # a --domain with a trailing dot leaves no host ending in it: no short forms at all
    assert proxy_domain("ns1", "ns1.svc.cluster.local.") == "svc.cluster.local."
    assert alt_hosts("a.ns2.svc.cluster.local", kube, "ns1", "svc.cluster.local.") == ["a.ns2.svc.cluster.local."]
    assert proxy_domain("ns1", "") == ""


def test_unspellable_names_never_match() -> None:
    nt = _table({
        "svc.ns1.svc.cluster.local": info(["1.2.3.4"], "Kubernetes", "svc", "ns1", ["alt.example.", "sp ace.example"]),
        "bad label.example": info(["5.6.7.8"]),
        "x" * 64 + ".example": info(["5.6.7.8"]),
    })
    lookup = _lookup(nt)
    texts = {wire.name_to_text(n) for n in lookup.names}
    assert "svc." in texts
    # "alt.example." + "." and unescaped spaces or over-long labels: no query can carry them
    assert not any("alt.example" in t or "ace.example" in t or "bad" in t or "xxxx" in t for t in texts)


def test_root_name_gets_no_search_expansion() -> None:
    """An empty External host is the root name upstream; its expansion ".ns1.svc.cluster.local." is no name."""
    r = _responder(_table({"": info(["1.2.3.4"])}))
    assert _answers(r.respond(query("."), False, counts())) == [(".", "A", "1.2.3.4")]
    assert asks_upstream(r.respond(query("ns1.svc.cluster.local."), False, counts()))


def test_ip_parsing_as_go_netip() -> None:
    v4, v6 = split_ips([" 1.2.3.4", "1.2.3.4", "01.2.3.4", "::ffff:1.2.3.4", "fe80::1%eth0", "cidr/24"])
    assert v4 == (bytes([1, 2, 3, 4]),)
    assert len(v6) == 2  # an IPv4-mapped address is IPv6 to Go (AAAA), a zone is allowed


# ---- search-domain expansion -----------------------------------------------------------

def test_names_ending_in_the_first_search_domain_are_not_expanded() -> None:
    nt = _table({"foo.xns1.svc.cluster.local": info(["1.2.3.4"]), "www.example": info(["5.6.7.8"])})
    r = _responder(nt)
    # a string suffix again: "foo.xns1.svc.cluster.local." ends in "ns1.svc.cluster.local."
    assert asks_upstream(r.respond(query("foo.xns1.svc.cluster.local.ns1.svc.cluster.local."), False, counts()))
    assert [t for _, t, _ in _answers(r.respond(query("www.example.ns1.svc.cluster.local."), False, counts()))] == [
        "CNAME", "A"]


@pytest.mark.parametrize("search", [("ns1.svc.cluster.local.",), ("NS1.svc.cluster.local",)])
def test_search_domain_spelled_otherwise_expands_every_name(search: tuple[str, ...]) -> None:
    """Upstream tests the suffix against the search domain as resolv.conf spells it, and lower-cases
    only the expansion: with a trailing dot or capitals no name "ends in it", so all are expanded."""
    r = _responder(name_table(), search=search)
    name = "productpage.ns1.svc.cluster.local.ns1.svc.cluster.local."
    assert _answers(r.respond(query(name), False, counts())) == [
        (name, "CNAME", "productpage.ns1.svc.cluster.local."), ("productpage.ns1.svc.cluster.local.", "A", "9.9.9.9")]


def test_expansion_shadows_a_host_and_takes_the_targets_family_from_any_entry() -> None:
    nt = _table({
        "t": info(["fd00::7"]),  # "t." with IPv6 only ...
        "t.": info(["7.7.7.7"]),  # ... and "t." again (another key) with IPv4 only
        "t.ns1.svc.cluster.local": info(["8.8.8.8"]),  # a host named like t.'s expansion
    })
    r = _responder(nt)
    exp = "t.ns1.svc.cluster.local."
    assert _answers(r.respond(query(exp), False, counts())) == [(exp, "CNAME", "t."), ("t.", "A", "7.7.7.7")]
    assert _answers(r.respond(query(exp, "AAAA"), False, counts())) == [(exp, "CNAME", "t."), ("t.", "AAAA", "fd00::7")]
    assert _answers(r.respond(query("t.", "AAAA"), False, counts())) == [("t.", "AAAA", "fd00::7")]


def test_one_entrys_ipv4_and_anothers_ipv6_for_the_same_name() -> None:
    nt = _table({
        "dup.ns1.svc.cluster.local": info(["fd00::1"], "Kubernetes", "dup", "ns1"),  # offers "dup.ns1." (v6)
        "dup.ns1": info(["1.1.1.1"]),  # offers "dup.ns1." (v4)
    })
    r = _responder(nt)
    assert _answers(r.respond(query("dup.ns1."), False, counts())) == [("dup.ns1.", "A", "1.1.1.1")]
    assert _answers(r.respond(query("dup.ns1.", "AAAA"), False, counts())) == [("dup.ns1.", "AAAA", "fd00::1")]


# ---- wildcards and spelling ----------------------------------------------------------------

def test_most_specific_wildcard_answers_even_without_the_family() -> None:
    nt = _table({"*.b.wild": info(["1.1.1.1"]), "*.wild": info(["1.1.1.2", "fd00::2"])})
    r = _responder(nt)
    out = r.respond(query("x.b.wild.", "AAAA"), False, counts())
    assert isinstance(out, bytes) and dns.message.from_wire(out).rcode() == dns.rcode.NOERROR
    assert _answers(out) == []
    assert _answers(r.respond(query("x.c.wild.", "AAAA"), False, counts())) == [("x.c.wild.", "AAAA", "fd00::2")]


def test_labels_holding_dots_match_by_labels() -> None:
    """A label "a.b" is one label (miekg presents it "a\\.b"): under *.wildcard., and no exact match
    for the three-label name."""
    r = _responder(_table({"*.wildcard": info(["10.10.10.10"]), "a.b.example": info(["1.1.1.1"]),
                           "a\\.b.example": info(["2.2.2.2"])}))
    dotted = b"\x05a.b.c\x08wildcard\x00"
    q = b"\x00\x07\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + dotted + b"\x00\x01\x00\x01"
    out = r.respond(q, False, counts())
    assert isinstance(out, bytes)
    assert _answers(out) == [("a\\.b\\.c.wildcard.", "A", "10.10.10.10")]
    q = b"\x00\x07\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + b"\x03a.b\x07example\x00" + b"\x00\x01\x00\x01"
    assert _answers(r.respond(q, False, counts())) == [("a\\.b.example.", "A", "2.2.2.2")]


@pytest.mark.parametrize(("text", "wire_name"), [
    (".", b"\x00"),
    ("a.b.", b"\x01a\x01b\x00"),
    ("*.x.", b"\x01*\x01x\x00"),
    ("a\\.b.c.", b"\x03a.b\x01c\x00"),
    ("a\\ b\\@\\;\\(\\)\\\"\\\\\\'.", b"\x0aa b@;()\"\\'\x00"),
    ("\\000\\127\\255.", b"\x03\x00\x7f\xff\x00"),
])
def test_presentation_form_round_trips(text: str, wire_name: bytes) -> None:
    assert wire.name_from_text(text) == wire_name
    assert wire.name_to_text(wire_name) == text


@pytest.mark.parametrize("text", [
    "", "a.b", "a..b.", ".a.", "a b.", "a@b.", "\\097.", "\\a.", "a\\", "a\\.", "\\256.", "é.example.",
    "x" * 64 + ".", ".".join(["abcdefgh"] * 32) + ".",
])
def test_only_canonical_presentation_has_a_wire_form(text: str) -> None:
    assert wire.name_from_text(text) is None


_TEXT = st.text(alphabet="ab.\\0129 @\"*-é", max_size=12)


@settings(max_examples=2000, deadline=None)
@given(_TEXT, _TEXT)
def test_expansion_is_the_two_parts_wire_forms_joined(host: str, suffix: str) -> None:
    """What the builder relies on to expand without reparsing: after a host (which ends in an
    unescaped dot, and is not the root) a search suffix starts afresh, so the expansion has a wire
    form exactly when both parts do, and it is theirs joined."""
    host_wire, suffix_wire = wire.name_from_text(host), wire.name_from_text(suffix)
    if host_wire in (None, b"\x00") or suffix_wire in (None, b"\x00"):
        return
    assert host_wire is not None and suffix_wire is not None
    joined = host_wire[:-1] + suffix_wire
    assert wire.name_from_text(host + suffix) == (joined if len(joined) <= 255 else None)
    assert wire.name_to_text(joined) == host + suffix


@settings(max_examples=2000, deadline=None)
@given(st.binary(min_size=1, max_size=63))
def test_every_wire_label_has_a_canonical_text(label: bytes) -> None:
    name = bytes((len(label),)) + label + b"\x00"
    assert wire.name_from_text(wire.name_to_text(name)) == name


def test_go_lower() -> None:
    assert go_lower("WWW.Example.COM.") == "www.example.com."
    assert go_lower("\u0130stio.io.") == "istio.io."  # Go's simple mapping; Python's str.lower gives "i̇"
    assert go_lower("\u212aube.") == "kube."  # KELVIN SIGN
    r = _responder(_table({"\u0130STIO.io": info(["1.2.3.4"])}))
    assert _answers(r.respond(query("istio.io."), False, counts())) == [("istio.io.", "A", "1.2.3.4")]


def test_resolve_takes_lower_case_wire_names() -> None:
    lookup = _lookup(name_table())
    recs = resolve(lookup, wire.encode_name("foo.wildcard.ns1.svc.cluster.local."), wire.TYPE_A)
    assert recs is not None
    assert [(r.owner, r.rtype) for r in recs] == [(wire.encode_name("foo.wildcard.ns1.svc.cluster.local."), 5),
                                                  (wire.encode_name("*.wildcard."), 1)]


# ---- the forwarder's reply size ------------------------------------------------------------

class _Sent:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def sendto(self, data: bytes) -> None:
        self.sent.append(data)

    def is_closing(self) -> bool:
        return False


@pytest.mark.parametrize(("size", "accepted"), [(512, True), (513, False)])
def test_udp_reply_larger_than_the_query_allows_fails_the_server(size: int, accepted: bool) -> None:
    """Upstream's Go client reads a UDP reply into a buffer of the query's size: more cannot be parsed."""
    upstream = _UdpUpstream(random.Random(1))
    transport = _Sent()
    upstream.connection_made(transport)  # type: ignore[arg-type]
    q = query("giant.")
    got: list[bytes | None] = []
    assert upstream.send(q, len(q), 10.0, got.append, 512)
    sent = transport.sent[0]
    reply = sent[:2] + b"\x81\x80" + sent[4:]
    reply += b"\x00" * (size - len(reply))
    upstream.datagram_received(reply, ("127.0.0.1", 53))
    assert got == [reply if accepted else None]
    assert upstream.pending == {}
