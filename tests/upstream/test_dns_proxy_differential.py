"""The DNS proxy (:15053) against upstream's Go agent's, on generated queries.

One pair of agents for the module (`upstream_agent_pair`): upstream's `pilot-agent` and ours as sidecars on one
local node, with ISTIO_META_DNS_CAPTURE=true, fed the same NameTable by istiod-local (Kubernetes services in two
namespaces, one sharing a short name; service entries with one address, several of both families, IPv6 only,
none (left to real DNS), and a wildcard host (never in the table)). Each pod's resolv.conf names one nameserver,
127.0.0.1 (so both proxies listen on 127.0.0.1:15053 only), and the search list of a pod in `default`. That
nameserver is `FakeResolver`, a small dnspython server in each pod's network namespace whose answer is a pure
function of the query: the first label of a name chooses what it does (`nx-` NXDOMAIN with an SOA, `refused-`,
`servfail-`, `cname-` a chain to an address, `big-` 40 addresses (truncated to the client's UDP size, as a
resolver does), `huge-` the same never truncated (a resolver that breaks the UDP size rule), `txt-` text
records), and a name's addresses derive from its text, so both agents forward to identical upstreams.

Each case is one query (a name inside or outside the table, in search-domain forms: the short name, `name.ns`,
`name.ns.svc`, the FQDN, with or without one of the search domains appended; letters in random case; types A,
AAAA, CNAME, SRV, TXT, PTR, MX, NS, SOA, ANY and HTTPS; RD set or not; no EDNS or EDNS with a payload from below
512 to 65535), sent over UDP or TCP to 127.0.0.1:15053 in each pod at once. Compared as DNS messages (dnspython):
the id and question (echoed), rcode, opcode, the flags QR AA TC RD RA, whether EDNS is there and its payload,
and the answer, authority and additional sections as sets of records in text (names keep their case; TTLs are
not normalised: the NameTable's are 30 s in both, the resolver's fixed); a truncated reply's sections are
compared by size only (which records a truncation keeps follows upstream's random round robin).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.query
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import poll
from upstream_agent_pair import SIDES, AgentPair, NetnsWorkers, agent_pair
from upstream_peers import DIFF_EXAMPLES, Tally, describe, differential

pytestmark = pytest.mark.root

SEARCH = ("default.svc.cluster.local", "svc.cluster.local", "cluster.local")
RESOLV_CONF = f"nameserver 127.0.0.1\nsearch {' '.join(SEARCH)}\noptions ndots:5\n"
PROXY_PORT = 15053
RESOLVER_TTL = 300


def _service(name: str, namespace: str, ip: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "selector": {"app": name}, "clusterIP": ip,
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "HTTP"}]}


SERVICES = [_service("alpha", "default", "10.96.1.10"), _service("beta", "default", "10.96.1.11"),
            _service("gamma", "other", "10.96.1.12"), _service("alpha", "other", "10.96.1.13")]
STATIC = {"resolution": "STATIC", "endpoints": [{"address": "192.0.2.99"}]}
HTTP_PORT = [{"number": 80, "name": "http", "protocol": "HTTP"}]
TLS_PORT = [{"number": 443, "name": "tls", "protocol": "TCP"}]
SERVICE_ENTRIES = [
    {"hosts": ["api.example.com"], "addresses": ["192.0.2.10"], **STATIC, "ports": TLS_PORT},
    {"hosts": ["multi.example.org"], "addresses": ["192.0.2.20", "192.0.2.21", "2001:db8::21"], **STATIC,
     "ports": HTTP_PORT},
    {"hosts": ["v6only.example.net"], "addresses": ["2001:db8::30"], **STATIC, "ports": HTTP_PORT},
    {"hosts": ["noaddr.example.com"], "resolution": "DNS", "ports": TLS_PORT},
    {"hosts": ["*.wild.example.com"], "addresses": ["192.0.2.40"], **STATIC, "ports": TLS_PORT},
]


# --- the resolver both agents forward to ----------------------------------------------------------------------
def _digest(name: dns.name.Name) -> int:
    return zlib.crc32(name.to_text().lower().encode())


def resolver_answer(query: dns.message.Message) -> tuple[dns.message.Message, bool]:
    """The fake upstream's reply to `query`, and whether it keeps to the client's UDP size (a pure function)."""
    response = dns.message.make_response(query, our_payload=1232)
    response.flags |= dns.flags.RA
    if not query.question:
        response.set_rcode(dns.rcode.FORMERR)
        return response, True
    question = query.question[0]
    name, rdtype = question.name, question.rdtype
    kind = name.labels[0].decode(errors="replace").lower().partition("-")[0] if name.labels else ""
    soa = dns.rrset.from_text("test.", RESOLVER_TTL, "IN", "SOA", "ns.test. hostmaster.test. 1 7200 3600 86400 60")
    digest = _digest(name)
    if query.edns > 0:  # as a real resolver (RFC 6891 6.1.3)
        response.set_rcode(dns.rcode.BADVERS)
        return response, True
    if kind == "refused":
        response.set_rcode(dns.rcode.REFUSED)
        return response, True
    if kind == "servfail":
        response.set_rcode(dns.rcode.SERVFAIL)
        return response, True
    if kind == "nx":
        response.set_rcode(dns.rcode.NXDOMAIN)
        response.authority.append(soa)
        return response, True
    if question.rdclass != dns.rdataclass.IN:
        response.set_rcode(dns.rcode.NOTIMP)
        return response, True
    owner = name
    if kind == "cname" and rdtype != dns.rdatatype.CNAME:
        target = dns.name.from_text(f"target-{digest % 1000}.ext.test.")
        response.answer.append(dns.rrset.from_text(name, RESOLVER_TTL, "IN", "CNAME", target.to_text()))
        owner = target
    elif kind == "cname":
        response.answer.append(dns.rrset.from_text(name, RESOLVER_TTL, "IN", "CNAME", f"t-{digest % 97}.ext.test."))
        return response, True
    count = 40 if kind in ("big", "huge") else 1
    records: list[str] = []
    if rdtype in (dns.rdatatype.A, dns.rdatatype.ANY):
        records += [f"A 198.51.{(digest >> 8) % 256}.{(digest + i) % 256}" for i in range(count)]
    if rdtype in (dns.rdatatype.AAAA, dns.rdatatype.ANY):
        records += [f"AAAA 2001:db8:{digest % 65536:x}::{i + 1:x}" for i in range(count)]
    if rdtype == dns.rdatatype.TXT or (kind == "txt" and rdtype == dns.rdatatype.ANY):
        records += [f'TXT "v={digest % 10000}" "{kind}"']
    if rdtype == dns.rdatatype.SRV:
        records += [f"SRV 10 {digest % 100} {digest % 60000 + 1} host-{digest % 50}.ext.test."]
    if rdtype == dns.rdatatype.MX:
        records += [f"MX 10 mail-{digest % 50}.ext.test."]
    if rdtype == dns.rdatatype.PTR:
        records += [f"PTR host-{digest % 500}.ext.test."]
    for record in records:
        kind_text, _, data = record.partition(" ")
        rrset = response.find_rrset(response.answer, owner, dns.rdataclass.IN, dns.rdatatype.from_text(kind_text),
                                    create=True)
        rrset.update_ttl(RESOLVER_TTL)
        rrset.add(dns.rrset.from_text(owner, RESOLVER_TTL, "IN", kind_text, data)[0])
    if not records:
        response.authority.append(soa)
    return response, kind != "huge"


def _udp_limit(query: dns.message.Message) -> int:
    return max(512, query.payload) if query.edns >= 0 else 512


def resolver_wire(data: bytes, udp: bool) -> bytes | None:
    try:
        query = dns.message.from_wire(data)
    except dns.exception.DNSException:
        return None
    response, keeps_limit = resolver_answer(query)
    wire = response.to_wire(max_size=65535)  # not the request's size: truncation is ours to do, below
    if udp and keeps_limit and len(wire) > _udp_limit(query):
        response.answer, response.authority, response.additional = [], [], []
        response.flags |= dns.flags.TC
        wire = response.to_wire(max_size=65535)
    return wire


class FakeResolver:
    """`resolver_answer` served on UDP and TCP 127.0.0.1:53 of one network namespace (sockets made there)."""

    def __init__(self, inside: NetnsWorkers) -> None:
        def sockets() -> tuple[socket.socket, socket.socket]:
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.bind(("127.0.0.1", 53))
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tcp.bind(("127.0.0.1", 53))
            tcp.listen(64)
            return udp, tcp

        self.udp, self.tcp = inside.run(sockets)
        self.queries = 0
        self.errors: list[str] = []
        for target in (self._serve_udp, self._serve_tcp):
            threading.Thread(target=target, daemon=True).start()

    def _serve_udp(self) -> None:
        while True:
            try:
                data, peer = self.udp.recvfrom(65535)
            except OSError:
                return
            self.queries += 1
            wire = self._answer(data, udp=True)
            if wire is not None:
                with contextlib.suppress(OSError):
                    self.udp.sendto(wire, peer)

    def _answer(self, data: bytes, udp: bool) -> bytes | None:
        try:
            return resolver_wire(data, udp)
        except Exception as exc:  # a bug here must fail the test, not silently stop the server
            self.errors.append(f"{type(exc).__name__}: {exc} answering {data!r}")
            return None

    def _serve_tcp(self) -> None:
        while True:
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                return
            threading.Thread(target=self._tcp_connection, args=(conn,), daemon=True).start()

    def _tcp_connection(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                while True:
                    head = _read_exact(conn, 2)
                    if head is None:
                        return
                    data = _read_exact(conn, struct.unpack("!H", head)[0])
                    if data is None:
                        return
                    self.queries += 1
                    wire = self._answer(data, udp=False)
                    if wire is not None:
                        conn.sendall(struct.pack("!H", len(wire)) + wire)
            except OSError:
                return

    def close(self) -> None:
        for sock in (self.udp, self.tcp):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _read_exact(conn: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


# --- generated queries ----------------------------------------------------------------------------------------
KUBE_NAMES = [(s["name"], s["namespace"]) for s in SERVICES] + [("delta", "default"), ("gamma", "default")]
LABEL = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?\Z", fullmatch=True)
KINDS = ["", "", "nx-", "refused-", "servfail-", "cname-", "big-", "huge-", "txt-"]
QTYPES = ["A", "A", "AAAA", "AAAA", "CNAME", "SRV", "TXT", "PTR", "MX", "NS", "SOA", "ANY", "HTTPS"]
SUFFIXES = ["", "", "", "", "", "", *SEARCH, "example.com"]


@st.composite
def kube_name(draw: st.DrawFn) -> str:
    short, namespace = draw(st.sampled_from(KUBE_NAMES))
    form = draw(st.sampled_from([short, f"{short}.{namespace}", f"{short}.{namespace}.svc",
                                 f"{short}.{namespace}.svc.cluster.local"]))
    suffix = draw(st.sampled_from(SUFFIXES))
    return f"{form}.{suffix}" if suffix else form


@st.composite
def entry_name(draw: st.DrawFn) -> str:
    host = draw(st.sampled_from(["api.example.com", "multi.example.org", "v6only.example.net", "noaddr.example.com",
                                 "x.wild.example.com", "wild.example.com"]))
    suffix = draw(st.sampled_from(SUFFIXES))
    return f"{host}.{suffix}" if suffix else host


@st.composite
def outside_name(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(KINDS))
    domain = draw(st.sampled_from(["ext.test", "example.com", *SEARCH, "local"]))
    return f"{kind}{draw(LABEL)}.{domain}"


def reverse_name(ip: str) -> str:
    return ".".join(reversed(ip.split("."))) + ".in-addr.arpa"


ODD_NAMES = st.sampled_from(["", "localhost", "alpha.default.svc.cluster.local.example.com", "cluster.local",
                             "svc.cluster.local", reverse_name("10.96.1.10"), reverse_name("192.0.2.10"),
                             "1.0.0.127.in-addr.arpa"])


def random_case(draw: st.DrawFn, name: str) -> str:
    if not draw(st.integers(0, 3)):
        flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
        return "".join(c.upper() if flip else c for c, flip in zip(name, flips, strict=True))
    return name


NAMES = {"service": kube_name(), "service-entry": entry_name(), "outside": outside_name(), "odd": ODD_NAMES}


@st.composite
def queries(draw: st.DrawFn) -> dict[str, Any]:
    category = draw(st.sampled_from(["service", "service", "service-entry", "outside", "odd"]))
    name = draw(NAMES[category])
    return {
        "category": category,
        "name": random_case(draw, name) + ".",
        "type": draw(st.sampled_from(QTYPES)),
        "class": draw(st.sampled_from(["IN"] * 15 + ["CH"])),
        "transport": draw(st.sampled_from(["udp", "udp", "tcp"])),
        "edns": draw(st.sampled_from([None, None, 0, 100, 512, 1232, 4096, 65535])),
        "do": draw(st.booleans()),
        "rd": draw(st.sampled_from([True, True, True, False])),
        "id": draw(st.integers(0, 65535)),
        "cd": not draw(st.integers(0, 7)),
        "ad": not draw(st.integers(0, 7)),
        # Rarely: another opcode, no question or two, an EDNS version upstream does not speak.
        "opcode": draw(st.sampled_from(["QUERY"] * 30 + ["NOTIFY", "UPDATE", "STATUS"])),
        "questions": draw(st.sampled_from([1] * 30 + [0, 2])),
        "edns_version": draw(st.sampled_from([0] * 15 + [1])),
    }


def build_query(case: dict[str, Any]) -> dns.message.Message:
    edns = case["edns"] is not None
    query = dns.message.make_query(case["name"], case["type"], case["class"], use_edns=case["edns_version"] if edns
                                   else False, payload=case["edns"] or 0, want_dnssec=case["do"] and edns,
                                   id=case["id"])
    if not case["rd"]:
        query.flags &= ~dns.flags.RD
    for flag in ("cd", "ad"):
        if case[flag]:
            query.flags |= dns.flags.from_text(flag.upper())
    query.set_opcode(dns.opcode.from_text(case["opcode"]))
    if case["questions"] == 0:
        query.question = []
    elif case["questions"] == 2:
        query.question.append(dns.rrset.RRset(dns.name.from_text("alpha.default.svc.cluster.local."),
                                              dns.rdataclass.IN, dns.rdatatype.A))
    return query


# --- asking and comparing -------------------------------------------------------------------------------------
def ask(query: dns.message.Message, transport: str, timeout: float = 8.0) -> dns.message.Message | str:
    """The proxy's reply on 127.0.0.1:15053 of the calling thread's namespace, or what went wrong."""
    try:
        if transport == "tcp":
            return dns.query.tcp(query, "127.0.0.1", port=PROXY_PORT, timeout=timeout)
        return dns.query.udp(query, "127.0.0.1", port=PROXY_PORT, timeout=timeout, ignore_unexpected=True,
                             raise_on_truncation=False)
    except dns.exception.Timeout:
        return "timeout"
    except (dns.exception.DNSException, OSError, ValueError) as exc:
        return f"error: {type(exc).__name__}"


FLAGS = (dns.flags.QR, dns.flags.AA, dns.flags.TC, dns.flags.RD, dns.flags.RA, dns.flags.AD, dns.flags.CD)


def _records(section: list[dns.rrset.RRset]) -> list[str]:
    lines = []
    for rrset in section:
        lines += rrset.to_text(relativize=False).splitlines()
    return sorted(lines)


def normal_form(reply: dns.message.Message | str, query: dns.message.Message) -> dict[str, Any]:
    if isinstance(reply, str):
        return {"failed": reply}
    truncated = bool(reply.flags & dns.flags.TC)
    sections: dict[str, Any] = {key: _records(getattr(reply, key)) for key in ("answer", "authority", "additional")}
    if truncated:  # which records a truncation keeps follows a random round robin: compare how many
        sections = {key: len(value) for key, value in sections.items()}
    return {
        "id_echoed": reply.id == query.id,
        "question": [q.to_text() for q in reply.question],
        "rcode": dns.rcode.to_text(reply.rcode()),
        "opcode": dns.opcode.to_text(reply.opcode()),
        "flags": [dns.flags.to_text(flag) for flag in FLAGS if reply.flags & flag],
        "edns": None if reply.edns < 0 else {"version": reply.edns, "payload": reply.payload,
                                             "do": bool(reply.ednsflags & dns.flags.DO),
                                             "options": sorted(o.to_text() for o in reply.options)},
        **sections,
    }


@pytest.fixture(scope="module")
def pair() -> Iterator[AgentPair]:
    with agent_pair("ia-dnsdiff-", services=SERVICES, service_entries=SERVICE_ENTRIES,
                    agent_env={"ISTIO_META_DNS_CAPTURE": "true"}, resolv_conf=RESOLV_CONF) as pair:
        resolvers = [FakeResolver(pair.sides[side].inside) for side in SIDES]
        try:
            wanted = (("alpha.default.svc.cluster.local.", "10.96.1.10"), ("multi.example.org.", "192.0.2.2"),
                      ("gamma.other.svc.cluster.local.", "10.96.1.12"))

            def synced() -> bool:
                for name, address in wanted:
                    for reply in pair.both(lambda side, n=name: side.inside.run(  # type: ignore[misc]
                            lambda: ask(dns.message.make_query(n, "A"), "udp", timeout=1))):
                        if isinstance(reply, str) or address not in reply.to_text():
                            return False
                return True

            poll(synced, "both DNS proxies to answer from istiod-local's NameTable", timeout=60, interval=0.5)
            yield pair
            assert not [e for r in resolvers for e in r.errors], [e for r in resolvers for e in r.errors]
        finally:
            for resolver in resolvers:
                resolver.close()


@pytest.mark.timeout(120 + 2 * DIFF_EXAMPLES)  # one pytest test runs every generated case
def test_dns_proxy_differential(pair: AgentPair) -> None:
    tally = Tally("dns-proxy")

    @differential
    @given(case=queries())
    def compare(case: dict[str, Any]) -> None:
        query = build_query(case)
        theirs, ours = pair.both(lambda side: side.inside.run(lambda: ask(query, case["transport"])))
        expected, got = normal_form(theirs, query), normal_form(ours, query)
        deliberate = table_answer_opt(expected, got, query)
        if deliberate:
            got = {**got, "edns": None}
        assert got == expected, (f"case {describe(case)}\nupstream: {describe(expected)}\nours:     {describe(got)}\n"
                                 f"upstream's reply:\n{theirs}\nours:\n{ours}")
        tally.count(f"deliberate: {deliberate}" if deliberate else f"{case['category']}: {outcome(expected)}")

    compare()
    print(tally.report())
    assert tally.counts["cases"] >= 1


def table_answer_opt(expected: dict[str, Any], got: dict[str, Any], query: dns.message.Message) -> str:
    """Deliberate: a reply ours makes itself to an EDNS query (an answer from the table, SERVFAIL when no
    resolver answered) carries an OPT record (payload 1232, DO echoed), as RFC 6891 7 requires of a responder;
    upstream's never do (miekg's SetReply). Only that record may differ."""
    if query.edns < 0 or "failed" in expected or expected.get("edns") is not None:
        return ""
    ours_opt = {"version": 0, "payload": 1232, "do": bool(query.ednsflags & dns.flags.DO), "options": []}
    if got.get("edns") != ours_opt:
        return ""
    if "AA" in expected["flags"]:
        return "OPT record in an answer from the table"
    return "OPT record in SERVFAIL when no resolver answered" if expected["rcode"] == "SERVFAIL" else ""


def outcome(form: dict[str, Any]) -> str:
    if "failed" in form:
        return f"equal, both {form['failed']}"
    source = ("table" if "AA" in form["flags"] else "refused by the server" if not form["question"]
              else "forwarded")
    return f"equal, {source} {form['rcode']}" + (
        ", truncated" if "TC" in form["flags"] else "")


def test_the_resolver_is_the_one_both_agents_forward_to(pair: AgentPair) -> None:
    """A name only the fake resolver knows gets its address through either proxy (each reads the pod's
    resolv.conf, which `ip netns exec` mounted from /etc/netns)."""
    name = "probe-1.ext.test."
    expected = resolver_answer(dns.message.make_query(name, "A"))[0].answer[0][0].to_text()
    replies = pair.both(lambda side: side.inside.run(lambda: ask(dns.message.make_query(name, "A"), "udp")))
    for reply in replies:
        assert not isinstance(reply, str), reply
        assert [rr.to_text() for rrset in reply.answer for rr in rrset] == [expected]
