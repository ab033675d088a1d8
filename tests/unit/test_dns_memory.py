"""What a compiled NameTable holds: the lookup's maps, and answers only for names that were asked.

A pod asks for a handful of a mesh's names; packing every name's A and AAAA
answers up front held about 1 MB per 1,000 services (twice while a new table
replaced the old). These check that nothing is packed before a query, that the
first query for a name packs it once and later ones hit the packed answer, and
that a lazily packed answer is the answer itself (same records as from the
lookup), for an address name, a name lacking the asked family and a CNAME.
"""

from __future__ import annotations

import pytest
from test_dns_support import answer_set, ask, counts, query, responder

from istio_agent.dns.core.table import resolve
from istio_agent.dns.core.wire import TYPE_A, TYPE_AAAA, name_from_text


def test_a_new_table_holds_no_packed_answers() -> None:
    r = responder()
    assert r.table is not None
    assert r.table.answers == {}


@pytest.mark.parametrize(("name", "rdtype"), [
    ("productpage.ns1.svc.cluster.local.", "A"),
    ("productpage.", "A"),
    ("ipv4.localhost.", "AAAA"),  # known, no IPv6: NOERROR without records
    ("www.google.com.ns1.svc.cluster.local.", "A"),  # the search expansion: a CNAME
    ("big.localhost.", "A"),
])
def test_the_first_query_packs_the_answer_and_the_next_hits_it(name: str, rdtype: str) -> None:
    r = responder()
    assert r.table is not None
    data = query(name, rdtype)
    first = ask(r, data, tcp=True)  # (TCP: the 100 addresses of big.localhost. are not truncated)
    key = data[12:]
    assert list(r.table.answers) == [key]
    packed = r.table.answers[key]
    second = ask(r, data, tcp=True)
    assert r.table.answers[key] is packed  # the second answer came from the packed one
    assert answer_set(first) == answer_set(second)
    wire_name = name_from_text(name)
    assert wire_name is not None
    expected = resolve(r.table.lookup, wire_name, TYPE_A if rdtype == "A" else TYPE_AAAA)
    assert expected is not None
    assert len(answer_set(first)) == len(expected)


def test_a_name_not_in_the_table_packs_nothing() -> None:
    r = responder()
    assert r.table is not None
    out = r.respond(query("unknown.example."), False, counts())
    assert not isinstance(out, bytes)
    assert r.table.answers == {}
