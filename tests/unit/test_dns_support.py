"""Shared NameTable and helpers for the DNS unit tests (no tests here; imported by test_dns_*.py)."""

from __future__ import annotations

import dns.flags
import dns.message
import dns.rdatatype

from istio_agent.dns.core.answers import CompiledTable
from istio_agent.dns.core.responder import AskUpstream, Responder
from istio_agent.dns.core.table import build_lookup, proxy_domain
from istio_agent.dns.metrics import SLOTS
from istio_agent.protos import nds_pb2

NAMESPACE = "ns1"
DOMAIN = "ns1.svc.cluster.local"  # the proxy's --domain, namespace first as upstream passes it
SEARCH = ("ns1.svc.cluster.local", "svc.cluster.local", "cluster.local")


def info(ips: list[str], registry: str = "External", shortname: str = "", namespace: str = "",
         alt_hosts: list[str] | None = None) -> nds_pb2.NameInfo:
    return nds_pb2.NameInfo(ips=ips, registry=registry, shortname=shortname, namespace=namespace,
                            alt_hosts=alt_hosts or [])


def sample_table() -> nds_pb2.NameTable:
    nt = nds_pb2.NameTable()
    entries = {
        "www.google.com": info(["1.1.1.1"]),
        "productpage.ns1.svc.cluster.local": info(["9.9.9.9"], "Kubernetes", "productpage", "ns1"),
        "example.ns2.svc.cluster.local": info(["10.10.10.10"], "Kubernetes", "example", "ns2"),
        "details.ns2.svc.cluster.remote": info(["11.11.11.11", "12.12.12.12", "13.13.13.13"],
                                               "Kubernetes", "details", "ns2"),
        "svc-with-alt.ns1.svc.cluster.local": info(["15.15.15.15"], "Kubernetes", "svc-with-alt", "ns1",
                                                   ["svc-with-alt.ns1.svc.clusterset.local"]),
        "ipv6.localhost": info(["2001:db8::ff00:42:8329"]),
        "dual.localhost": info(["2.2.2.2", "2001:db8::ff00:42:8329"]),
        "ipv4.localhost": info(["2.2.2.2"]),
        "*.wildcard": info(["10.10.10.10"]),
        "*.b.wildcard": info(["11.11.11.11"]),
        "broken.localhost": info(["not-an-ip"]),
        "big.localhost": info([f"240.0.{i // 256}.{i % 256}" for i in range(100)]),
    }
    for host, entry in entries.items():
        nt.table[host].CopyFrom(entry)
    return nt


def compiled(table: nds_pb2.NameTable | None = None, search: tuple[str, ...] = SEARCH) -> CompiledTable:
    table = table if table is not None else sample_table()
    lookup = build_lookup(table, NAMESPACE, proxy_domain(NAMESPACE, DOMAIN), search)
    return CompiledTable(table, lookup, seed=1)


def responder(table: nds_pb2.NameTable | None = None) -> Responder:
    r = Responder()
    r.table = compiled(table)
    return r


def counts() -> list[int]:
    return [0] * SLOTS


def query(name: str, rdtype: str = "A", *, use_edns: int | bool = False, payload: int = 1232,
          want_dnssec: bool = False, qid: int = 4242, options: list[object] | None = None) -> bytes:
    q = dns.message.make_query(name, dns.rdatatype.from_text(rdtype), use_edns=use_edns, payload=payload,
                               want_dnssec=want_dnssec, options=options)  # type: ignore[arg-type]
    q.id = qid
    return q.to_wire()


def ask(r: Responder, data: bytes, tcp: bool = False, c: list[int] | None = None) -> dns.message.Message:
    """Respond and parse; fails the test if the responder wanted to forward or drop."""
    out = r.respond(data, tcp, c if c is not None else counts())
    assert isinstance(out, bytes), f"expected an answer, got {out!r}"
    return dns.message.from_wire(out)


def asks_upstream(out: object) -> bool:
    return isinstance(out, AskUpstream)


def answer_set(msg: dns.message.Message) -> list[tuple[str, str, int, str]]:
    """(owner, type, ttl, rdata) of every answer record, owners lower-cased."""
    out = []
    for rrset in msg.answer:
        for rd in rrset:
            out.append((rrset.name.to_text().lower(), dns.rdatatype.to_text(rrset.rdtype), rrset.ttl,
                        rd.to_text().lower()))
    return out


def is_authoritative(msg: dns.message.Message) -> bool:
    return bool(msg.flags & dns.flags.AA)
