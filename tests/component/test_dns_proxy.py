"""The DNS proxy on real loopback sockets, queried with dig, forwarding to a real dnsmasq."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import free_udp_tcp_port
from test_dns_peers import (
    BIG_COUNT,
    Dnsmasq,
    dig_message,
    dns_query,
    name_table,
    run_dnsmasq,
    running_proxy,
    upstream_args,
    write_resolv_conf,
)

from istio_agent.dns import DnsProxy, DnsProxyOptions, name_table_json
from istio_agent.dns.core.tcp_framing import frame
from istio_agent.metrics import CollectorRegistry, generate_latest


@pytest.fixture(scope="module")
def upstream() -> Iterator[Dnsmasq]:
    with run_dnsmasq(upstream_args()) as server:
        yield server


@pytest.fixture
async def proxy(tmp_path: Path, upstream: Dnsmasq) -> AsyncIterator[DnsProxy]:
    conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.1"])
    async with running_proxy(conf, upstream.port) as p:
        yield p


def _port(p: DnsProxy) -> int:
    return p.addresses[0][1]


async def _dig(p: DnsProxy, *args: str) -> dns.message.Message:
    return await asyncio.to_thread(dig_message, _port(p), *args)


def _ips(msg: dns.message.Message, rdtype: str = "A") -> list[str]:
    return sorted(rd.to_text() for rrset in msg.answer if dns.rdatatype.to_text(rrset.rdtype) == rdtype
                  for rd in rrset)




async def test_servfail_before_first_name_table(proxy: DnsProxy) -> None:
    msg = await _dig(proxy, "echo.ns1.svc.cluster.local")
    assert msg.rcode() == dns.rcode.SERVFAIL
    assert name_table_json(proxy.name_table()) == (404, "{}")
    assert not proxy.is_ready()


@pytest.mark.parametrize("name", [
    "echo.ns1.svc.cluster.local", "echo.ns1.svc", "echo.ns1", "echo", "ECHO.Ns1.SVC.cluster.LOCAL",
])
async def test_kubernetes_name_forms(proxy: DnsProxy, name: str) -> None:
    proxy.update_name_table(name_table())
    for transport in ([], ["+tcp"]):
        msg = await _dig(proxy, name, *transport)
        assert msg.rcode() == dns.rcode.NOERROR
        assert msg.flags & dns.flags.AA
        assert _ips(msg) == ["10.96.0.20"]
        assert all(rrset.ttl == 30 for rrset in msg.answer)


async def test_other_namespace_short_name_goes_upstream(proxy: DnsProxy) -> None:
    proxy.update_name_table(name_table())
    assert _ips(await _dig(proxy, "other.ns2")) == ["10.96.0.30"]
    # bare "other" is not ours (other namespace): dnsmasq's REFUSED (it has no upstream) comes back;
    # the proxy itself never answers REFUSED.
    msg = await _dig(proxy, "other")
    assert msg.rcode() == dns.rcode.REFUSED


async def test_search_domain_form_gets_cname_and_a(proxy: DnsProxy) -> None:
    proxy.update_name_table(name_table())
    msg = await _dig(proxy, "api.example.com.ns1.svc.cluster.local")
    types = [dns.rdatatype.to_text(rrset.rdtype) for rrset in msg.answer]
    assert types == ["CNAME", "A"]
    assert msg.answer[0][0].target.to_text() == "api.example.com."
    assert msg.answer[1].name.to_text() == "api.example.com."
    assert _ips(msg) == ["240.240.0.1"]


async def test_wildcard_and_aaaa(proxy: DnsProxy) -> None:
    proxy.update_name_table(name_table())
    assert _ips(await _dig(proxy, "deep.er.wild.example.com")) == ["240.240.0.9"]
    assert _ips(await _dig(proxy, "v6.example.com", "AAAA"), "AAAA") == ["fd00::1"]


@pytest.mark.parametrize(("name", "rdtype"), [("echo.ns1.svc.cluster.local", "AAAA"), ("v6.example.com", "A")])
async def test_missing_family_is_noerror_no_answer(proxy: DnsProxy, name: str, rdtype: str) -> None:
    proxy.update_name_table(name_table())
    msg = await _dig(proxy, name, rdtype)
    assert msg.rcode() == dns.rcode.NOERROR
    assert msg.flags & dns.flags.AA
    assert msg.answer == []


async def test_unknown_names_are_answered_by_upstream(proxy: DnsProxy) -> None:
    proxy.update_name_table(name_table())
    for transport in ([], ["+tcp"]):
        msg = await _dig(proxy, "www.ext.test", *transport)
        assert msg.rcode() == dns.rcode.NOERROR
        assert _ips(msg) == ["1.2.3.4"]
        txt = await _dig(proxy, "txt.ext.test", "TXT", *transport)
        assert [rd.to_text() for rrset in txt.answer for rd in rrset] == ['"hello from dnsmasq"']
    # a known name with a type we do not serve goes upstream too
    msg = await _dig(proxy, "echo.ns1.svc.cluster.local", "TXT")
    assert msg.rcode() == dns.rcode.REFUSED  # dnsmasq's word


@pytest.mark.parametrize("name", ["big.ext.test", "many.example.com"], ids=["forwarded", "local"])
async def test_large_answer_truncated_over_udp_complete_over_tcp(proxy: DnsProxy, name: str) -> None:
    proxy.update_name_table(name_table())
    udp = await _dig(proxy, name, "+noedns", "+ignore")
    assert udp.flags & dns.flags.TC
    assert 0 <= len(_ips(udp)) < BIG_COUNT
    edns = await _dig(proxy, name, "+bufsize=1232", "+ignore")
    assert edns.flags & dns.flags.TC
    tcp = await _dig(proxy, name, "+tcp")
    assert not tcp.flags & dns.flags.TC
    assert len(_ips(tcp)) == BIG_COUNT
    # and never an oversized datagram: check sizes with a raw client
    for payload, limit in ((None, 512), (1232, 1232), (4096, 4096)):
        q = dns.message.make_query(name, "A", use_edns=False if payload is None else 0, payload=payload or 512)
        data = await asyncio.to_thread(_udp_exchange, _port(proxy), q.to_wire())
        assert len(data) <= limit
        msg = dns.message.from_wire(data)
        assert bool(msg.flags & dns.flags.TC) == (limit < 1700)


async def test_oversized_upstream_reply_is_a_failed_upstream(tmp_path: Path) -> None:
    """An upstream UDP reply larger than the query allows fails that server, as upstream's Go client reads
    it into a buffer of that size and cannot parse it: SERVFAIL, never an oversized datagram."""
    big = dns.message.make_response(dns.message.make_query("huge.ext.test.", "A"))
    big.answer.append(dns.rrset.from_text_list("huge.ext.test.", 60, "IN", "A",
                                               [f"10.2.{i // 256}.{i % 256}" for i in range(300)]))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as upstream_sock:
        upstream_sock.bind(("127.0.0.1", 0))
        upstream_sock.settimeout(5)

        def serve(n: int) -> None:
            for _ in range(n):
                data, addr = upstream_sock.recvfrom(65535)
                big.id = int.from_bytes(data[:2], "big")
                upstream_sock.sendto(big.to_wire(max_size=65535), addr)  # ~5 KB whatever was asked

        conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.1"])
        async with running_proxy(conf, upstream_sock.getsockname()[1]) as p:
            p.update_name_table(name_table())
            server = asyncio.get_running_loop().run_in_executor(None, serve, 4)
            for payload, limit in ((None, 512), (1232, 1232), (4096, 4096), (65535, 65535)):
                q = dns.message.make_query("huge.ext.test.", "A", use_edns=False if payload is None else 0,
                                           payload=payload or 512)
                data = await asyncio.to_thread(_udp_exchange, _port(p), q.to_wire())
                assert len(data) <= limit
                msg = dns.message.from_wire(data)
                assert not msg.flags & dns.flags.TC
                if limit < 65535:
                    assert msg.rcode() == dns.rcode.SERVFAIL and not msg.answer
                else:  # it fits what this client asked for: passed on whole
                    assert msg.rcode() == dns.rcode.NOERROR and len(_ips(msg)) == 300
            await server


def _udp_exchange(port: int, wire: bytes) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(3)
        s.sendto(wire, ("127.0.0.1", port))
        return s.recv(65535)


async def test_upstream_refusing_gives_servfail(tmp_path: Path, upstream: Dnsmasq) -> None:
    dead = free_udp_tcp_port()  # nobody listens: ICMP port unreachable
    conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.1"])
    async with running_proxy(conf, dead, timeout=2.0) as p:
        p.update_name_table(name_table())
        for transport in ([], ["+tcp"]):
            msg = await _dig(p, "www.ext.test", *transport)
            assert msg.rcode() == dns.rcode.SERVFAIL
        assert _ips(await _dig(p, "echo")) == ["10.96.0.20"]  # local answers unaffected


async def test_upstream_silent_gives_servfail_after_timeout(tmp_path: Path) -> None:
    port = free_udp_tcp_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as blackhole, \
            socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp_blackhole:
        blackhole.bind(("127.0.0.1", port))  # receives, never answers
        tcp_blackhole.bind(("127.0.0.1", port))
        tcp_blackhole.listen(8)  # accepts (in the backlog), never reads
        conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.1"])
        async with running_proxy(conf, port, timeout=0.3) as p:
            p.update_name_table(name_table())
            for transport in ([], ["+tcp"]):
                # dig waits 3 s and reports no reply at all otherwise: the SERVFAIL is the proxy giving up.
                # How long that takes is bench_dns's silent_upstream_servfail_* figures, not a test.
                msg = await _dig(p, "www.ext.test", *transport)
                assert msg.rcode() == dns.rcode.SERVFAIL
            registry_text = generate_latest(p.metrics.registry).decode()
            assert "istio_agent_dns_upstream_failures_total 2.0" in registry_text


@pytest.mark.parametrize("parallel", [False, True], ids=["in-order", "parallel"])
async def test_second_server_used_when_first_fails(tmp_path: Path, parallel: bool) -> None:
    # Two upstream addresses on one port: 127.0.0.2 is dead, 127.0.0.1 is dnsmasq.
    port = free_udp_tcp_port()
    with run_dnsmasq(upstream_args(), port=port):
        conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.2", "127.0.0.1"])
        async with running_proxy(conf, port, timeout=0.5, parallel=parallel) as p:
            p.update_name_table(name_table())
            msg = await _dig(p, "www.ext.test")
            assert _ips(msg) == ["1.2.3.4"]
            msg = await _dig(p, "www.ext.test", "+tcp")
            assert _ips(msg) == ["1.2.3.4"]


async def test_update_name_table_swaps_while_serving(proxy: DnsProxy) -> None:
    proxy.update_name_table(name_table())
    assert _ips(await _dig(proxy, "echo")) == ["10.96.0.20"]
    nt = name_table()
    nt.table["echo.ns1.svc.cluster.local"].ips[:] = ["10.96.0.21"]
    proxy.update_name_table(nt)
    assert _ips(await _dig(proxy, "echo")) == ["10.96.0.21"]
    assert proxy.is_ready()
    status, body = name_table_json(proxy.name_table())
    assert status == 200 and "10.96.0.21" in body


async def test_metrics_count_outcomes(tmp_path: Path, upstream: Dnsmasq) -> None:
    registry = CollectorRegistry()
    conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.1"])
    async with running_proxy(conf, upstream.port, registry=registry) as p:
        port = _port(p)
        await asyncio.to_thread(dns_query, port, "echo.")  # before the table: failed
        p.update_name_table(name_table())
        await asyncio.to_thread(dns_query, port, "echo.")
        await asyncio.to_thread(dns_query, port, "echo.", "A", tcp=True)
        await asyncio.to_thread(dns_query, port, "www.ext.test.")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"\x00\x01garbage", ("127.0.0.1", port))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for f in text_string_to_metric_families(generate_latest(registry).decode())
                       for s in f.samples}
            if samples.get(("istio_agent_dns_queries_total", (("outcome", "malformed"), ("protocol", "udp")))):
                break
            await asyncio.sleep(0.02)
        assert samples[("istio_agent_dns_queries_total", (("outcome", "local"), ("protocol", "udp")))] == 1
        assert samples[("istio_agent_dns_queries_total", (("outcome", "local"), ("protocol", "tcp")))] == 1
        assert samples[("istio_agent_dns_queries_total", (("outcome", "forwarded"), ("protocol", "udp")))] == 1
        assert samples[("istio_agent_dns_queries_total", (("outcome", "failed"), ("protocol", "udp")))] == 1
        assert samples[("istio_agent_dns_queries_total", (("outcome", "malformed"), ("protocol", "udp")))] == 1
        assert samples[("istio_agent_dns_requests_total", ())] == 5
        assert samples[("istio_agent_dns_upstream_request_duration_seconds_count", ())] == 1


async def test_localhost_binds_ipv4_and_ipv6(tmp_path: Path, upstream: Dnsmasq) -> None:
    conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.1"])
    async with running_proxy(conf, upstream.port, addr="localhost:0") as p:
        p.update_name_table(name_table())
        hosts = [h for h, _ in p.addresses]
        assert "127.0.0.1" in hosts
        if "::1" in hosts:
            msg = await asyncio.to_thread(dig_message, _port(p), "echo", host="::1")
            assert _ips(msg) == ["10.96.0.20"]
        msg = await asyncio.to_thread(dig_message, _port(p), "echo", host="127.0.0.1")
        assert _ips(msg) == ["10.96.0.20"]


async def test_stop_releases_ports_and_threads(tmp_path: Path, upstream: Dnsmasq) -> None:
    before = {t.name for t in threading.enumerate()}
    conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.1"])
    port = free_udp_tcp_port()
    for _ in range(2):  # a fixed port can be bound again right after stop()
        async with running_proxy(conf, upstream.port, addr=f"127.0.0.1:{port}") as p:
            assert p.addresses == [("127.0.0.1", port)]
            p.update_name_table(name_table())
            assert _ips(await asyncio.to_thread(dig_message, port, "echo")) == ["10.96.0.20"]
    assert {t.name for t in threading.enumerate()} <= before | {"asyncio_0", "asyncio_1"}


async def test_agent_loop_busy_does_not_stop_answers(proxy: DnsProxy) -> None:
    """A long blocking stretch on the agent's loop does not stall DNS answers (own threads)."""
    proxy.update_name_table(name_table())
    port = _port(proxy)
    answered = []

    def client() -> None:
        for _ in range(20):
            answered.append(_ips(dns_query(port, "echo.", timeout=2.0)))

    def client_then_signal() -> None:
        try:
            client()
        finally:
            finished.set()

    finished = threading.Event()
    thread = asyncio.get_running_loop().run_in_executor(None, client_then_signal)
    finished.wait(timeout=60)  # deliberately blocks the agent's event loop for the whole client run
    await thread
    assert answered == [["10.96.0.20"]] * 20


async def test_async_update_compiles_off_loop(proxy: DnsProxy) -> None:
    await proxy.update_name_table_async(name_table())
    assert _ips(await _dig(proxy, "echo")) == ["10.96.0.20"]


async def test_port_in_use_fails_start_cleanly(tmp_path: Path, upstream: Dnsmasq) -> None:
    conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.1"])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        threads = threading.active_count()
        proxy = DnsProxy(DnsProxyOptions(addr=f"127.0.0.1:{port}", resolv_conf=str(conf)))
        with pytest.raises(OSError):
            await proxy.start()
        await proxy.stop()
        assert threading.active_count() == threads


def test_bad_address_is_rejected() -> None:
    with pytest.raises(ValueError):
        DnsProxy(DnsProxyOptions(addr="nonsense"))._bind()


def _tcp_read_frame(conn: socket.socket) -> bytes | None:
    """One length-prefixed DNS message from `conn`, None when the server closed the connection first."""
    buf = b""
    while len(buf) < 2 or len(buf) < 2 + int.from_bytes(buf[:2], "big"):
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    return buf[2:2 + int.from_bytes(buf[:2], "big")]


async def test_tcp_query_in_flight_holds_off_the_idle_close(tmp_path: Path) -> None:
    """A client waiting on a slow upstream is not idle: it gets its answer, then the idle close."""
    port = free_udp_tcp_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as blackhole, \
            socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp_blackhole:
        blackhole.bind(("127.0.0.1", port))
        tcp_blackhole.bind(("127.0.0.1", port))
        tcp_blackhole.listen(8)  # accepts, never answers: the forward lasts the whole upstream timeout
        conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.1"])
        async with running_proxy(conf, port, timeout=1.5, tcp_idle_timeout=0.5) as p:
            p.update_name_table(name_table())

            def exchange() -> tuple[bytes | None, bytes | None]:
                with socket.create_connection(("127.0.0.1", _port(p)), timeout=10) as conn:
                    conn.sendall(frame(dns.message.make_query("www.ext.test.", "A").to_wire()))
                    return _tcp_read_frame(conn), _tcp_read_frame(conn)

            answer, after = await asyncio.to_thread(exchange)
            assert answer is not None, "the connection was closed while its query was in flight"
            assert dns.message.from_wire(answer).rcode() == dns.rcode.SERVFAIL
            assert after is None  # then, with nothing in flight, the idle close


async def test_tcp_partial_frame_deadline_closes_a_stalled_frame(tmp_path: Path, upstream: Dnsmasq) -> None:
    """With the option on, 10 bytes of a 50-byte frame are given up long before the idle timeout."""
    conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.1"])
    async with running_proxy(conf, upstream.port, tcp_idle_timeout=3600.0, tcp_partial_frame_timeout=0.1) as p:
        p.update_name_table(name_table())

        def stalled_and_whole() -> tuple[bytes | None, bytes | None]:
            with socket.create_connection(("127.0.0.1", _port(p)), timeout=10) as stalled, \
                    socket.create_connection(("127.0.0.1", _port(p)), timeout=10) as whole:
                stalled.sendall((50).to_bytes(2, "big") + b"x" * 8)
                closed = _tcp_read_frame(stalled)
                whole.sendall(frame(dns.message.make_query("echo.", "A").to_wire()))
                return closed, _tcp_read_frame(whole)

        closed, answer = await asyncio.to_thread(stalled_and_whole)
        assert closed is None
        assert answer is not None and _ips(dns.message.from_wire(answer)) == ["10.96.0.20"]
