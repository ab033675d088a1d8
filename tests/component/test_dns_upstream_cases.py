"""Upstream Istio's DNS test table (pkg/dns/client/dns_test.go) against the real proxy, over UDP and TCP.

As upstream's TestDNS and TestDNSForwardParallel: the proxy on loopback with
upstream's NameTable, namespace, domain and search list, forwarding to a
stand-in resolver that answers as upstream's `makeUpstream` does (NXDOMAIN
for what it does not know), queried with dnspython as the independent
client. Each row is run over UDP and TCP (or the one its name says) with
sequential and parallel forwarding. Beyond upstream's checks (answers, and
rcode where it expects a failure) every row also checks its rcode, the
question echo, AA (local) vs. not (forwarded), class IN, TTL 30, and, from
the stand-in's log, that exactly the rows meant to be forwarded reached it
(over the client's transport). The rows live in tests/dns_upstream_table.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import dns.asyncquery
import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import pytest
from dns_upstream_table import CASE_CASES, CASES, SEARCH, TTL, Case, name_table, standin_reply
from support import free_udp_tcp_port
from test_dns_peers import running_proxy, write_resolv_conf

from istio_agent.dns import DnsProxy
from istio_agent.dns.core.tcp_framing import frame

CLIENT_TIMEOUT = 3.0  # as upstream's test clients


@dataclass
class StandIn:
    """makeUpstream's resolver on 127.0.0.1:port, UDP and TCP; logs (transport, lower-case name) it is asked."""

    silent: bool = False
    seen: list[tuple[str, str]] = field(default_factory=list)
    port: int = 0

    def answer(self, transport: str, data: bytes) -> bytes | None:
        try:
            name = dns.message.from_wire(data).question[0].name.to_text().lower()
        except Exception:
            name = "?"
        self.seen.append((transport, name))
        return None if self.silent else standin_reply(data)


class _StandInUdp(asyncio.DatagramProtocol):
    def __init__(self, standin: StandIn) -> None:
        self.standin = standin
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        out = self.standin.answer("udp", data)
        if out is not None and self.transport is not None:
            self.transport.sendto(out, addr)  # whole, whatever its size: as miekg's WriteMsg


@contextlib.asynccontextmanager
async def serving(standin: StandIn) -> AsyncIterator[StandIn]:
    """Run the stand-in on this loop (the proxy forwards from its own thread) until the block ends."""
    loop = asyncio.get_running_loop()

    async def on_tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(2), "big")
                out = standin.answer("tcp", await reader.readexactly(size))
                if out is not None:
                    writer.write(frame(out))
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    standin.port = free_udp_tcp_port()
    udp, _ = await loop.create_datagram_endpoint(lambda: _StandInUdp(standin), local_addr=("127.0.0.1", standin.port))
    tcp = await asyncio.start_server(on_tcp, "127.0.0.1", standin.port)
    try:
        yield standin
    finally:
        udp.close()
        tcp.close()
        await tcp.wait_closed()


@contextlib.asynccontextmanager
async def upstream_setup(tmp_path: Path, standin: StandIn, parallel: bool,
                         timeout: float = CLIENT_TIMEOUT / 2) -> AsyncIterator[DnsProxy]:
    """initDNS: the proxy (namespace ns1, domain ns1.svc.cluster.local) forwarding to the stand-in, table filled."""
    conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.1"], search=" ".join(SEARCH))
    async with serving(standin), running_proxy(conf, standin.port, parallel=parallel, timeout=timeout) as proxy:
        proxy.update_name_table(name_table())
        yield proxy


def _query(case: Case) -> dns.message.Message:
    q = dns.message.make_query(case.host, dns.rdatatype.from_text(case.qtype),
                               use_edns=0 if case.edns_payload is not None else False,
                               payload=case.edns_payload or 1232)
    if case.qid is not None:
        q.id = case.qid
    return q


async def _exchange(q: dns.message.Message, port: int, transport: str) -> dns.message.Message:
    if transport == "udp":
        return await dns.asyncquery.udp(q, "127.0.0.1", port=port, timeout=CLIENT_TIMEOUT, one_rr_per_rrset=True)
    return await dns.asyncquery.tcp(q, "127.0.0.1", port=port, timeout=CLIENT_TIMEOUT, one_rr_per_rrset=True)


def _records(msg: dns.message.Message) -> list[tuple[str, str, str]]:
    """(owner as sent, type, rdata) of each answer record in wire order."""
    return [(rrset.name.to_text(), dns.rdatatype.to_text(rrset.rdtype), rd.to_text())
            for rrset in msg.answer for rd in rrset]


def _runs(cases: list[Case]) -> list[object]:
    return [pytest.param(case, transport, id=f"{transport}-{case.name}")
            for case in cases for transport in ("udp", "tcp") if case.transport in (None, transport)]


@pytest.mark.parametrize("parallel", [False, True], ids=["TestDNS", "TestDNSForwardParallel"])
@pytest.mark.parametrize(("case", "transport"), _runs(CASES) + _runs(CASE_CASES))
async def test_upstream_table(tmp_path: Path, case: Case, transport: str, parallel: bool) -> None:
    standin = StandIn()
    async with upstream_setup(tmp_path, standin, parallel) as proxy:
        q = _query(case)
        msg = await _exchange(q, proxy.addresses[0][1], transport)
    assert msg.id == q.id
    assert dns.rcode.to_text(msg.rcode()) == dns.rcode.to_text(case.rcode)
    assert msg.question[0].name.to_text() == case.host  # the client's spelling, as sent
    got = _records(msg)
    assert (got if case.ordered else sorted(got)) == (case.expected if case.ordered else sorted(case.expected))
    assert all(rrset.rdclass == dns.rdataclass.IN and rrset.ttl == TTL for rrset in msg.answer)
    assert bool(msg.flags & dns.flags.AA) == case.local  # we are the authority for our names only
    assert bool(msg.flags & dns.flags.TC) == case.truncated
    asked = [seen for seen in standin.seen if seen[1] == case.host.lower()]
    assert asked == ([(transport, case.host.lower())] if case.forwarded else [])


async def test_round_robin_varies_the_order_with_the_query_id(tmp_path: Path) -> None:
    """The rows upstream pins to an order through its hooked id source: every order holds the same
    records, and each address comes first for some query id (DNS load balancing)."""
    host = "details.ns2.svc.cluster.remote."
    firsts = set()
    async with upstream_setup(tmp_path, StandIn(), parallel=False) as proxy:
        for qid in range(8):
            q = dns.message.make_query(host, "A")
            q.id = qid
            for transport in ("udp", "tcp"):
                ips = [data for _, _, data in _records(await _exchange(q, proxy.addresses[0][1], transport))]
                assert sorted(ips) == ["11.11.11.11", "12.12.12.12", "13.13.13.13", "14.14.14.14"]
                firsts.add(ips[0])
    assert len(firsts) == 4


@pytest.mark.parametrize("transport", ["udp", "tcp"])
async def test_query_without_question_gets_servfail(tmp_path: Path, transport: str) -> None:
    """upstream's ServeDNS answers a request without a question SERVFAIL (miekg passes a bare header
    claiming one question on as such); nothing is forwarded."""
    data = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    standin = StandIn()
    async with upstream_setup(tmp_path, standin, parallel=False) as proxy:
        port = proxy.addresses[0][1]
        if transport == "udp":
            out = await asyncio.wait_for(_raw_udp(port, data), CLIENT_TIMEOUT)
        else:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(frame(data))
                size = int.from_bytes(await asyncio.wait_for(reader.readexactly(2), CLIENT_TIMEOUT), "big")
                out = await reader.readexactly(size)
            finally:
                writer.close()
    msg = dns.message.from_wire(out)
    assert msg.id == 0x1234 and msg.flags & dns.flags.QR and msg.flags & dns.flags.RD
    assert msg.rcode() == dns.rcode.SERVFAIL
    assert not msg.question and not msg.answer
    assert standin.seen == []


async def _raw_udp(port: int, data: bytes) -> bytes:
    loop = asyncio.get_running_loop()
    got: asyncio.Future[bytes] = loop.create_future()

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, reply: bytes, addr: tuple[str, int]) -> None:
            if not got.done():
                got.set_result(reply)

    transport, _ = await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", port))
    try:
        transport.sendto(data)
        return await got
    finally:
        transport.close()


@pytest.mark.parametrize("parallel", [False, True], ids=["sequential", "parallel"])
@pytest.mark.parametrize("transport", ["udp", "tcp"])
async def test_silent_upstream_gets_servfail(tmp_path: Path, transport: str, parallel: bool) -> None:
    """TestDNSTimeoutBehavior without its clock: an upstream that never answers ends in SERVFAIL once the
    upstream timeout passes (how long that takes is measured in benchmarks/bench_dns.py)."""
    standin = StandIn(silent=True)
    async with upstream_setup(tmp_path, standin, parallel, timeout=0.2) as proxy:
        msg = await _exchange(dns.message.make_query("test.example.com.", "A"), proxy.addresses[0][1], transport)
    assert msg.rcode() == dns.rcode.SERVFAIL
    assert not msg.answer
    assert (transport, "test.example.com.") in standin.seen
