"""EDNS handling, truncation and malformed input, on the sans-IO responder and wire helpers."""

from __future__ import annotations

import random

import dns.edns
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dns_support import answer_set, ask, asks_upstream, counts, query, responder

from istio_agent.dns.core import wire
from istio_agent.dns.core.responder import FAILED, LOCAL, MALFORMED, AskUpstream, Responder

BIG = "big.localhost."  # 100 A records: 16 bytes each with a pointer owner


# ---- EDNS ------------------------------------------------------------------------------------


def test_edns_query_keeps_fast_path_and_echoes_opt() -> None:
    r = responder()
    c = counts()
    cookie = dns.edns.GenericOption(dns.edns.COOKIE, b"\x01" * 8)
    msg = ask(r, query("productpage.ns1.", use_edns=0, payload=4096, options=[cookie]), c=c)
    assert c[LOCAL] == 1
    assert msg.edns == 0
    assert msg.payload == wire.OUR_UDP_SIZE
    assert not msg.ednsflags & dns.flags.DO
    assert [d for *_, d in answer_set(msg)] == ["9.9.9.9"]


def test_do_bit_is_copied() -> None:
    msg = ask(responder(), query("productpage.ns1.", use_edns=0, want_dnssec=True))
    assert msg.ednsflags & dns.flags.DO


def test_edns_version_1_is_answered_as_version_0() -> None:
    """As upstream's: miekg's server does not check the version and neither does its handler (no BADVERS)."""
    c = counts()
    msg = ask(responder(), query("productpage.ns1.", use_edns=1), c=c)
    assert msg.rcode() == dns.rcode.NOERROR
    assert [d for *_, d in answer_set(msg)] == ["9.9.9.9"]
    assert c[LOCAL] == 1 and c[MALFORMED] == 0
    assert isinstance(responder().respond(query("unknown.example.", use_edns=1), False, counts()),
                      AskUpstream)


@pytest.mark.parametrize(("payload", "tcp", "truncated"), [
    (None, False, True),  # no EDNS: 512 bytes
    (512, False, True),
    (100, False, True),  # below 512 counts as 512
    (1232, False, True),
    (4096, False, False),
    (None, True, False),  # TCP: up to 64 KiB
])
def test_large_local_answer_is_truncated_to_client_size(payload: int | None, tcp: bool, truncated: bool) -> None:
    r = responder()
    data = query(BIG) if payload is None else query(BIG, use_edns=0, payload=payload)
    out = r.respond(data, tcp, counts())
    assert isinstance(out, bytes)
    limit = 65535 if tcp else max(512, payload or 512)
    assert len(out) <= limit
    msg = dns.message.from_wire(out)
    assert bool(msg.flags & dns.flags.TC) == truncated
    n = len(answer_set(msg))
    assert (n < 100) == truncated
    assert n > 0
    if payload is not None:
        assert msg.edns == 0  # the OPT record survives truncation


def test_udp_limit() -> None:
    assert wire.parse_query(query("x.")).udp_limit == 512
    assert wire.parse_query(query("x.", use_edns=0, payload=300)).udp_limit == 512
    assert wire.parse_query(query("x.", use_edns=0, payload=4000)).udp_limit == 4000


# ---- fit() on upstream responses -------------------------------------------------------------


def _big_response(n: int, with_opt: bool, authority: int = 0, additional: int = 0) -> bytes:
    q = dns.message.make_query("ext.test.", dns.rdatatype.TXT, use_edns=0 if with_opt else False)
    resp = dns.message.make_response(q)
    for i in range(n):
        resp.answer.append(dns.rrset.from_text("ext.test.", 60, "IN", "TXT", f'"record {i} ' + "x" * 40 + '"'))
    for i in range(authority):
        resp.authority.append(dns.rrset.from_text("test.", 60, "IN", "NS", f"ns{i}.test."))
    for i in range(additional):
        resp.additional.append(dns.rrset.from_text(f"ns{i}.test.", 60, "IN", "A", f"10.0.0.{i}"))
    return resp.to_wire(max_size=65535)


@pytest.mark.parametrize("with_opt", [False, True])
@pytest.mark.parametrize("limit", [512, 1000, 1232, 4096])
def test_fit_cuts_at_record_boundary(with_opt: bool, limit: int) -> None:
    full = _big_response(100, with_opt, authority=2, additional=2)
    cut = wire.fit(full, limit)
    assert len(cut) <= limit
    msg = dns.message.from_wire(cut)
    assert msg.flags & dns.flags.TC
    assert 0 < len(msg.answer[0]) < 100
    assert (msg.edns == 0) == with_opt
    # every record that is kept is byte-for-byte one of the original, in order
    original = dns.message.from_wire(full)
    assert list(msg.answer[0])[: len(msg.answer[0])] == list(original.answer[0])[: len(msg.answer[0])]


def test_fit_leaves_small_responses_alone() -> None:
    small = _big_response(2, True)
    assert wire.fit(small, 512) is small


def test_fit_without_tc_when_only_additional_dropped() -> None:
    resp = _big_response(1, False, additional=60)
    cut = wire.fit(resp, 512)
    msg = dns.message.from_wire(cut)
    assert len(cut) <= 512 and not msg.flags & dns.flags.TC
    assert len(msg.answer) == 1


def test_fit_of_garbage_keeps_header_and_sets_tc() -> None:
    q = query("ext.test.")
    junk = q[:2] + b"\x81\x80\x00\x01\x00\x05\x00\x00\x00\x00" + q[12:] + b"\xff" * 900
    cut = wire.fit(junk, 512)
    assert len(cut) <= 512
    msg = dns.message.from_wire(cut)
    assert msg.flags & dns.flags.TC and msg.question[0].name.to_text() == "ext.test."


# ---- malformed input -------------------------------------------------------------------------


def test_short_packets_and_responses_are_dropped_and_counted() -> None:
    r = responder()
    for data in (b"", b"\x00", b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00", query("productpage.ns1.")[:2]):
        c = counts()
        assert r.respond(data, False, c) is None
        assert c[MALFORMED] == 1
    response = bytearray(query("productpage.ns1."))
    response[2] |= 0x80
    c = counts()
    assert r.respond(bytes(response), False, c) is None
    assert c[MALFORMED] == 1


@pytest.mark.parametrize("mutate", [
    lambda q: q + b"\x00",  # trailing junk
    lambda q: q[:-1],  # truncated question
    lambda q: q[:12] + b"\x3f" + q[13:],  # label length past the end
    lambda q: q[:12] + b"\x80" + q[13:],  # reserved label type
    lambda q: q[:12] + b"\xc0\x0c" + q[-4:],  # compression pointer in the question (loop)
    lambda q: q[:-5] + b"\xc0\x00" + q[-4:],  # pointer after the first label (into the header)
    lambda q: q[:4] + b"\x00\x00" + q[6:],  # QDCOUNT 0 with a question following
    lambda q: q[:4] + b"\x00\x02" + q[6:],  # QDCOUNT 2, one question
    lambda q: q[:10] + b"\x00\x01" + q[12:],  # ARCOUNT 1, no record
    lambda q: q[:6] + b"\x00\x05" + q[8:],  # ANCOUNT 5 in a query
])
def test_malformed_queries_get_formerr(mutate: object) -> None:
    q = query("productpage.ns1.")
    data = mutate(q)  # type: ignore[operator]
    c = counts()
    out = responder().respond(data, False, c)
    assert isinstance(out, bytes)
    msg = dns.message.from_wire(out, question_only=True) if len(out) > 12 else None
    assert out[:2] == q[:2]
    assert out[2] & 0x80
    assert out[3] & 0x0F == dns.rcode.FORMERR
    assert msg is None or msg.rcode() == dns.rcode.FORMERR
    assert c[MALFORMED] == 1


def test_bad_opt_records_get_formerr() -> None:
    q = query("productpage.ns1.", use_edns=0)
    two_opts = q[:10] + b"\x00\x02" + q[12:] + q[-11:]
    bad_option = q[:-2] + b"\x00\x03" + b"\x00\x0a\x00"  # option header cut short
    for data in (two_opts, bad_option):
        c = counts()
        out = responder().respond(data, False, c)
        assert isinstance(out, bytes) and out[3] & 0x0F == dns.rcode.FORMERR
        assert c[MALFORMED] == 1


@pytest.mark.parametrize("opcode", [dns.opcode.IQUERY, dns.opcode.STATUS, dns.opcode.UPDATE])
def test_other_opcodes_get_notimp(opcode: dns.opcode.Opcode) -> None:
    q = dns.message.make_query("productpage.ns1.", dns.rdatatype.A)
    q.set_opcode(opcode)
    c = counts()
    msg = ask(responder(), q.to_wire(), c=c)
    assert msg.rcode() == dns.rcode.NOTIMP
    assert c[MALFORMED] == 1


@pytest.mark.parametrize("edns", [False, 0])
def test_notify_is_answered_as_a_query_keeping_its_opcode(edns: int | bool) -> None:
    """miekg's server accepts NOTIFY as it does QUERY; upstream's handler answers it from the table, and
    SetReply keeps the opcode and copies RD and CD only for a QUERY."""
    q = dns.message.make_query("productpage.ns1.", dns.rdatatype.A, use_edns=edns)
    q.set_opcode(dns.opcode.NOTIFY)
    q.flags |= dns.flags.RD | dns.flags.CD
    c = counts()
    msg = ask(responder(), q.to_wire(), c=c)
    assert msg.rcode() == dns.rcode.NOERROR and msg.opcode() == dns.opcode.NOTIFY
    assert msg.flags & (dns.flags.QR | dns.flags.AA | dns.flags.RD | dns.flags.CD) == dns.flags.QR | dns.flags.AA
    assert [d for *_, d in answer_set(msg)] == ["9.9.9.9"] and c[LOCAL] == 1
    q = dns.message.make_query("unknown.example.", dns.rdatatype.A)
    q.set_opcode(dns.opcode.NOTIFY)
    assert isinstance(responder().respond(q.to_wire(), False, counts()), AskUpstream)


def test_query_without_question_is_formerr() -> None:
    """QDCOUNT 0: miekg's server rejects the header before any handler runs, with FORMERR."""
    data = b"\xab\xcd\x01\x00" + b"\x00" * 8
    out = responder().respond(data, False, counts())
    assert isinstance(out, bytes)
    assert out[:2] == b"\xab\xcd" and out[3] & 0x0F == dns.rcode.FORMERR


@pytest.mark.parametrize("table", [True, False], ids=["table", "before-table"])
@pytest.mark.parametrize(("flags", "counts_after_qd"), [
    (b"\x01\x00", b"\x00\x00\x00\x00\x00\x00"),  # RD
    (b"\x00\x10", b"\x00\x01\x00\x01\x00\x02"),  # CD; the most other records miekg's server accepts
])
def test_header_claiming_one_question_gets_servfail(table: bool, flags: bytes, counts_after_qd: bytes) -> None:
    """QDCOUNT 1 and nothing after the header: miekg parses that as no question, upstream answers SERVFAIL."""
    data = b"\xab\xcd" + flags + b"\x00\x01" + counts_after_qd
    c = counts()
    out = (responder() if table else Responder()).respond(data, False, c)
    assert out == b"\xab\xcd" + bytes((0x80 | flags[0], 0x02 | flags[1])) + b"\x00" * 8
    assert c[FAILED] == 1
    assert dns.message.from_wire(out).rcode() == dns.rcode.SERVFAIL


@pytest.mark.parametrize("data", [
    b"\xab\xcd\x01\x00\x00\x01\x00\x02\x00\x00\x00\x00",  # two answer records claimed: rejected
    b"\xab\xcd\x01\x00\x00\x01\x00\x00\x00\x00\x00\x03",  # three additional
    b"\xab\xcd\x01\x00\x00\x02\x00\x00\x00\x00\x00\x00",  # two questions
])
def test_header_only_that_miekg_rejects_is_formerr(data: bytes) -> None:
    out = responder().respond(data, False, counts())
    assert isinstance(out, bytes) and out[3] & 0x0F == dns.rcode.FORMERR


def test_unusual_but_valid_query_takes_slow_path() -> None:
    # A query carrying an (ignored) authority record is valid for miekg-based servers.
    q = dns.message.make_query("productpage.ns1.", dns.rdatatype.A)
    q.authority.append(dns.rrset.from_text("ns1.", 60, "IN", "NS", "x.ns1."))
    c = counts()
    msg = ask(responder(), q.to_wire(), c=c)
    assert [d for *_, d in answer_set(msg)] == ["9.9.9.9"]
    assert c[LOCAL] == 1


def test_encode_name_limits() -> None:
    assert wire.encode_name(".") == b"\x00"
    assert wire.encode_name("A.b") == b"\x01a\x01b\x00"
    with pytest.raises(ValueError):
        wire.encode_name("a" * 64 + ".x")
    with pytest.raises(ValueError):
        wire.encode_name("a..b")
    with pytest.raises(ValueError):
        wire.encode_name(".".join(["abcdefgh"] * 40))


@settings(max_examples=3000, deadline=None)
@given(st.binary(max_size=600), st.booleans())
def test_responder_never_raises_on_random_bytes(data: bytes, tcp: bool) -> None:
    c = counts()
    out = responder_cache.respond(data, tcp, c)
    assert out is None or isinstance(out, bytes) or asks_upstream(out)
    assert sum(c) <= 1
    if isinstance(out, bytes):
        assert len(out) <= (65535 if tcp else max(512, len(data) + 600))
        assert out[:2] == data[:2]


@settings(max_examples=3000, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["productpage.ns1.", BIG, "a.b.wildcard.", "x.test."]),
       st.booleans())
def test_responder_never_raises_on_mutated_queries(seed: int, name: str, edns: bool) -> None:
    rng = random.Random(seed)
    data = bytearray(query(name, use_edns=0 if edns else False, qid=seed & 0xFFFF))
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(3)
        pos = rng.randrange(len(data))
        if op == 0:
            data[pos] = rng.randrange(256)
        elif op == 1:
            del data[pos]
        else:
            data.insert(pos, rng.randrange(256))
    c = counts()
    out = responder_cache.respond(bytes(data), False, c)
    assert out is None or isinstance(out, bytes) or asks_upstream(out)
    if isinstance(out, bytes):
        assert out[:2] == bytes(data[:2]) and out[2] & 0x80
        if (out[2] >> 3) & 0xF == dns.opcode.QUERY:  # dnspython reads UPDATE etc. with other rules
            dns.message.from_wire(out, question_only=True)  # every reply we send parses


responder_cache = responder()
