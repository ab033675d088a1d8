"""Local answers for every upstream name form, through the real Responder, parsed by dnspython."""

from __future__ import annotations

import dns.flags
import dns.rcode
import pytest
from test_dns_support import (
    answer_set,
    ask,
    asks_upstream,
    compiled,
    counts,
    info,
    is_authoritative,
    query,
    responder,
    sample_table,
)

from istio_agent.dns.core.responder import FAILED, LOCAL, Responder
from istio_agent.dns.core.table import alt_hosts, build_lookup, proxy_domain, resolve
from istio_agent.dns.core.wire import encode_name
from istio_agent.protos import nds_pb2

A = [
    # (question, expected (owner, type, rdata) answers in order-insensitive form)
    ("www.google.com.", [("www.google.com.", "A", "1.1.1.1")]),
    ("productpage.ns1.svc.cluster.local.", [("productpage.ns1.svc.cluster.local.", "A", "9.9.9.9")]),
    ("productpage.ns1.svc.", [("productpage.ns1.svc.", "A", "9.9.9.9")]),
    ("productpage.ns1.", [("productpage.ns1.", "A", "9.9.9.9")]),
    ("productpage.", [("productpage.", "A", "9.9.9.9")]),  # same namespace: bare name
    ("example.ns2.", [("example.ns2.", "A", "10.10.10.10")]),
    ("example.ns2.svc.", [("example.ns2.svc.", "A", "10.10.10.10")]),
    ("example.ns2.svc.cluster.local.", [("example.ns2.svc.cluster.local.", "A", "10.10.10.10")]),
    ("svc-with-alt.", [("svc-with-alt.", "A", "15.15.15.15")]),
    ("svc-with-alt.ns1.svc.clusterset.local.", [("svc-with-alt.ns1.svc.clusterset.local.", "A", "15.15.15.15")]),
    ("dual.localhost.", [("dual.localhost.", "A", "2.2.2.2")]),
    ("foo.wildcard.", [("foo.wildcard.", "A", "10.10.10.10")]),
    ("a.b.wildcard.", [("a.b.wildcard.", "A", "11.11.11.11")]),  # most specific wildcard wins
    ("x.y.z.wildcard.", [("x.y.z.wildcard.", "A", "10.10.10.10")]),
    ("*.wildcard.", [("*.wildcard.", "A", "10.10.10.10")]),
    # search-domain expansions: CNAME to the name, then its addresses owned by the target
    ("www.google.com.ns1.svc.cluster.local.", [("www.google.com.ns1.svc.cluster.local.", "CNAME", "www.google.com."),
                                              ("www.google.com.", "A", "1.1.1.1")]),
    ("productpage.ns1.ns1.svc.cluster.local.", [("productpage.ns1.ns1.svc.cluster.local.", "CNAME",
                                                 "productpage.ns1."), ("productpage.ns1.", "A", "9.9.9.9")]),
    ("foo.wildcard.ns1.svc.cluster.local.", [("foo.wildcard.ns1.svc.cluster.local.", "CNAME", "*.wildcard."),
                                             ("*.wildcard.", "A", "10.10.10.10")]),
]


@pytest.mark.parametrize(("name", "expected"), A, ids=[n for n, _ in A])
@pytest.mark.parametrize("edns", [False, True], ids=["plain", "edns"])
def test_a_answers_every_name_form(name: str, expected: list[tuple[str, str, str]], edns: bool) -> None:
    r = responder()
    c = counts()
    msg = ask(r, query(name, use_edns=0 if edns else False), c=c)
    assert msg.rcode() == dns.rcode.NOERROR
    assert is_authoritative(msg)
    assert msg.id == 4242
    assert msg.question[0].name.to_text() == name
    got = answer_set(msg)
    assert sorted((o, t, d) for o, t, _, d in got) == sorted(expected)
    assert all(ttl == 30 for _, _, ttl, _ in got)
    cname_first = [t for _, t, _, _ in got]
    assert cname_first == sorted(cname_first, key=lambda t: t != "CNAME")  # CNAME precedes addresses
    assert (msg.edns >= 0) == edns  # OPT echoed only when the query had one
    assert c[LOCAL] == 1


def test_aaaa_answers() -> None:
    r = responder()
    msg = ask(r, query("dual.localhost.", "AAAA"))
    assert answer_set(msg) == [("dual.localhost.", "AAAA", 30, "2001:db8::ff00:42:8329")]
    msg = ask(r, query("ipv6.localhost.", "AAAA"))
    assert answer_set(msg) == [("ipv6.localhost.", "AAAA", 30, "2001:db8::ff00:42:8329")]


@pytest.mark.parametrize(("name", "rdtype"), [
    ("ipv4.localhost.", "AAAA"),
    ("ipv6.localhost.", "A"),
    ("productpage.ns1.svc.cluster.local.", "AAAA"),
    ("productpage.ns1.ns1.svc.cluster.local.", "AAAA"),  # expanded name: no CNAME either (upstream)
    ("foo.wildcard.", "AAAA"),
])
def test_missing_family_is_noerror_without_records(name: str, rdtype: str) -> None:
    msg = ask(responder(), query(name, rdtype))
    assert msg.rcode() == dns.rcode.NOERROR
    assert is_authoritative(msg)
    assert msg.answer == []


@pytest.mark.parametrize(("name", "rdtype"), [
    ("www.bing.com.", "A"),
    ("example.", "A"),  # other namespace: no bare name
    ("details.ns2.", "A"),  # other cluster domain: no short forms
    ("details.ns2.svc.", "A"),
    ("broken.localhost.", "A"),  # no parsable address: not ours
    ("productpage.ns1.svc.cluster.local.", "MX"),  # other types go upstream
    ("productpage.ns1.svc.cluster.local.", "TXT"),
    ("wildcard.", "A"),  # a wildcard does not cover its own parent
    ("www.google.com.svc.cluster.local.", "A"),  # only the first search domain is expanded
])
def test_not_ours_is_forwarded(name: str, rdtype: str) -> None:
    c = counts()
    out = responder().respond(query(name, rdtype), False, c)
    assert asks_upstream(out)
    assert c == counts()  # forwarded queries are counted when the upstream answers


def test_other_cluster_domain_answers_fqdn_only() -> None:
    msg = ask(responder(), query("details.ns2.svc.cluster.remote."))
    assert sorted(d for *_, d in answer_set(msg)) == ["11.11.11.11", "12.12.12.12", "13.13.13.13"]


def test_mixed_case_query_echoes_spelling_in_the_question_only() -> None:
    """As upstream: the question comes back as sent, every owner in lower case (miekg writes them so)."""
    r = responder()
    for name in ("PRODUCTPAGE.NS1.SVC.CLUSTER.LOCAL.", "ProductPage.Ns1.", "WWW.Google.COM.ns1.svc.cluster.local.",
                 "Foo.WildCard.", "X.Foo.WildCard.NS1.svc.cluster.local."):
        for edns in (False, 0):
            msg = ask(r, query(name, use_edns=edns))
            assert msg.question[0].name.to_text() == name
            assert msg.answer, name
            assert msg.answer[0].name.to_text() == name.lower()
            assert all(rrset.name.to_text() == rrset.name.to_text().lower() for rrset in msg.answer)
            assert answer_set(msg) == answer_set(ask(r, query(name.lower(), use_edns=edns)))


def test_class_is_ignored_like_upstream() -> None:
    import dns.message
    import dns.rdataclass
    import dns.rdatatype
    q = dns.message.make_query("productpage.ns1.", dns.rdatatype.A, rdclass=dns.rdataclass.CH)
    msg = ask(responder(), q.to_wire())
    assert [d for *_, d in answer_set(msg)] == ["9.9.9.9"]


def test_servfail_before_first_table() -> None:
    c = counts()
    out = Responder().respond(query("productpage.ns1."), False, c)
    assert isinstance(out, bytes)
    import dns.message
    msg = dns.message.from_wire(out)
    assert msg.rcode() == dns.rcode.SERVFAIL
    assert msg.id == 4242
    assert c[FAILED] == 1


def test_respond_before_sync_forwards() -> None:
    out = Responder(respond_before_sync=True).respond(query("anything."), False, counts())
    assert asks_upstream(out)


def test_rd_and_cd_are_copied_and_ra_is_not_set() -> None:
    import dns.message
    import dns.rdatatype
    q = dns.message.make_query("productpage.ns1.", dns.rdatatype.A)
    q.flags = dns.flags.CD  # RD off, CD on
    msg = ask(responder(), q.to_wire())
    assert msg.flags & dns.flags.CD
    assert not msg.flags & dns.flags.RD
    assert not msg.flags & dns.flags.RA  # as upstream (miekg SetReply)
    q.flags = dns.flags.RD
    msg = ask(responder(), q.to_wire())
    assert msg.flags & dns.flags.RD and not msg.flags & dns.flags.CD


def test_addresses_are_shuffled_by_query_id() -> None:
    r = responder()
    firsts = set()
    for qid in range(16):
        msg = ask(r, query("details.ns2.svc.cluster.remote.", qid=qid))
        ips = [d for *_, d in answer_set(msg)]
        assert sorted(ips) == ["11.11.11.11", "12.12.12.12", "13.13.13.13"]
        firsts.add(ips[0])
    assert len(firsts) == 3


def test_many_addresses_get_random_orderings() -> None:
    r = responder()
    orders = {tuple(d for *_, d in answer_set(ask(r, query("big.localhost.", use_edns=0, payload=4096, qid=i))))
              for i in range(32)}
    assert len(orders) > 1
    assert all(len(o) == 100 and len(set(o)) == 100 for o in orders)


def test_alt_hosts_and_short_forms() -> None:
    i = info(["1.2.3.4"], "Kubernetes", "svc", "ns1", ["Other.Name"])
    # spelled as given: lower-cased only when the names are built (upstream compares before that)
    assert alt_hosts("svc.ns1.svc.cluster.local", i, "ns1", "svc.cluster.local") == [
        "svc.ns1.svc.cluster.local.", "svc.ns1.", "svc.", "svc.ns1.svc.", "Other.Name."]
    assert alt_hosts("svc.ns1.svc.cluster.local", i, "ns2", "svc.cluster.local") == [
        "svc.ns1.svc.cluster.local.", "svc.ns1.", "svc.ns1.svc.", "Other.Name."]
    # no domain or other domain: only the host itself (alt hosts too are dropped, as upstream)
    assert alt_hosts("svc.ns1.svc.cluster.local", i, "ns1", "") == ["svc.ns1.svc.cluster.local."]
    assert alt_hosts("svc.ns1.svc.other", i, "ns1", "svc.cluster.local") == ["svc.ns1.svc.other."]
    assert alt_hosts("svc.ns1.svc.cluster.local", info(["1.2.3.4"], "External", "svc", "ns1"), "ns1",
                     "svc.cluster.local") == ["svc.ns1.svc.cluster.local."]
    assert proxy_domain("ns1", "ns1.svc.cluster.local") == "svc.cluster.local"
    assert proxy_domain("ns1", "svc.cluster.local") == "svc.cluster.local"


def test_conflicts_resolve_deterministically() -> None:
    nt = nds_pb2.NameTable()
    # "a.ns1." is a short form of the Kubernetes service and the own host of an External entry.
    nt.table["a.ns1"].CopyFrom(info(["7.7.7.7"]))
    nt.table["a.ns1.svc.cluster.local"].CopyFrom(info(["1.1.1.1"], "Kubernetes", "a", "ns1"))
    # "b.ns1.svc.cluster.local." is both a real host and the search expansion of "b.".
    nt.table["b"].CopyFrom(info(["3.3.3.3"]))
    nt.table["b.ns1.svc.cluster.local"].CopyFrom(info(["4.4.4.4"]))
    # two External entries aliasing the same name: the lexically smaller host wins
    nt.table["z.example"].CopyFrom(info(["5.5.5.5"], alt_hosts=["shared.example"]))
    nt.table["shared.example"].CopyFrom(info(["6.6.6.6"]))
    for _ in range(3):
        lookup = build_lookup(nt, "ns1", "svc.cluster.local", ("ns1.svc.cluster.local",))
        # own host wins (upstream: Go's map order decides)
        assert [r.data for r in resolve(lookup, encode_name("a.ns1."), 1) or []] == [bytes([7, 7, 7, 7])]
        # the expansion's CNAME wins, as upstream looks CNAMEs up first (not a matter of map order)
        assert [(r.rtype, r.data) for r in resolve(lookup, encode_name("b.ns1.svc.cluster.local."), 1) or []] == [
            (5, encode_name("b.")), (1, bytes([3, 3, 3, 3]))]
        assert [r.data for r in resolve(lookup, encode_name("a."), 1) or []] == [bytes([1, 1, 1, 1])]
        assert [r.data for r in resolve(lookup, encode_name("shared.example."), 1) or []] == [bytes([6, 6, 6, 6])]


def test_no_search_domains_means_no_cnames() -> None:
    r = Responder()
    r.table = compiled(search=())
    assert asks_upstream(r.respond(query("www.google.com.ns1.svc.cluster.local."), False, counts()))


def test_update_swaps_whole_table() -> None:
    r = responder()
    assert ask(r, query("www.google.com.")).answer
    nt = nds_pb2.NameTable()
    nt.table["new.example"].CopyFrom(info(["8.8.8.8"]))
    r.table = compiled(nt)
    assert asks_upstream(r.respond(query("www.google.com."), False, counts()))
    assert [d for *_, d in answer_set(ask(r, query("new.example.")))] == ["8.8.8.8"]


def test_search_expanded_answers_are_packed_on_first_use() -> None:
    r = responder()
    assert r.table is not None
    data = query("www.google.com.ns1.svc.cluster.local.")
    key = data[12:]
    assert key not in r.table.answers
    first = ask(r, data)
    assert key in r.table.answers  # the next query for it is a plain dictionary hit
    second = ask(r, data)
    assert answer_set(first) == answer_set(second)
    assert [t for _, t, _, _ in answer_set(second)] == ["CNAME", "A"]


def test_sample_table_shape() -> None:
    assert "productpage.ns1.svc.cluster.local" in sample_table().table
