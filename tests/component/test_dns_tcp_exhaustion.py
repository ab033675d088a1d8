"""DNS over TCP under a connection-holding attack, on real loopback sockets.

Two defences, each shown on its own:
- deadlines (the defaults): a connection that drips a partial frame, or sends
  nothing, is closed a few seconds after it connected, however it drips;
- shared slots: with every deadline pushed out of reach, 1,100 connections
  held open by an attacker (from another address, from dig's own address, or
  spread over 20 addresses so that the global cap is reached) do not lock out
  a real `dig +tcp`, and UDP is answered throughout.

Loopback is a /8 on Linux, so an attacker binds 127.0.0.x source addresses
of its own while dig queries from 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dns.message
import dns.rdatatype
import pytest
from support import poll
from test_dns_peers import (
    Dnsmasq,
    dig_message,
    dns_query,
    name_table,
    run_dnsmasq,
    running_proxy,
    upstream_args,
    write_resolv_conf,
)

from istio_agent.dns import DnsProxy

ECHO = "echo.ns1.svc.cluster.local"
ECHO_IP = "10.96.0.20"
HELD = 1100  # more than the proxy's 1,024 slots
FDS_NEEDED = 4096  # the attacker's sockets and the proxy's, in this one process
NEVER = 3600.0  # a deadline no test reaches
PARTIAL = (50).to_bytes(2, "big") + b"x" * 8  # 10 bytes of a 52-byte frame (a 50-byte message)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Dnsmasq]:
    with run_dnsmasq(upstream_args()) as server:
        yield server


@pytest.fixture
def enough_fds() -> Iterator[None]:
    """Raise this process's open-file limit for the duration of one test (the hard limit permitting)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= FDS_NEEDED:
        yield
        return
    if hard != resource.RLIM_INFINITY and hard < FDS_NEEDED:
        pytest.skip(f"needs {FDS_NEEDED} open files, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (FDS_NEEDED, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _port(p: DnsProxy) -> int:
    return p.addresses[0][1]


def _ips(msg: dns.message.Message) -> list[str]:
    return sorted(rd.to_text() for rrset in msg.answer if rrset.rdtype == dns.rdatatype.A for rd in rrset)


def _closed_by_peer(conn: socket.socket) -> bool:
    """True once the proxy closed `conn` (FIN or RST). `conn` must be non-blocking: with a timeout set,
    Python waits for readability before any recv, MSG_DONTWAIT or not."""
    try:
        return conn.recv(4096) == b""
    except BlockingIOError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


async def test_slow_drip_and_silent_connections_are_closed(tmp_path: Path, upstream: Dnsmasq) -> None:
    """20 connections dripping a partial frame and 5 silent ones are all closed within 5 s (the defaults);
    dripping a byte every quarter second never completes the frame, and never buys more time."""
    conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.1"])
    async with running_proxy(conf, upstream.port) as p:
        p.update_name_table(name_table())

        def attack() -> None:
            with contextlib.ExitStack() as stack:
                drips = [stack.enter_context(_connect(_port(p))) for _ in range(20)]
                silent = [stack.enter_context(_connect(_port(p))) for _ in range(5)]
                for conn in drips:
                    conn.sendall(PARTIAL)
                for conn in drips + silent:
                    conn.setblocking(False)
                open_ = set(drips + silent)
                last_drip = time.monotonic()

                def all_closed() -> bool:
                    nonlocal last_drip
                    dripping = time.monotonic() - last_drip >= 0.25
                    for conn in list(open_):
                        if _closed_by_peer(conn):
                            open_.discard(conn)
                        elif dripping and conn in drips:
                            with contextlib.suppress(OSError):  # closed between the check and the send
                                conn.send(b"x")
                    if dripping:
                        last_drip = time.monotonic()
                    return not open_

                poll(all_closed, "the proxy closing every dripping and silent connection", timeout=5.0,
                     on_timeout=lambda: f"{len(open_)} of 25 still open")

        await asyncio.to_thread(attack)
        await asyncio.to_thread(poll, lambda: len(p.tcp_table) == 0, "the proxy forgetting them", 5.0)
        # and the proxy is as good as new, over both transports
        assert _ips(await asyncio.to_thread(dns_query, _port(p), ECHO, tcp=True)) == [ECHO_IP]
        assert _ips(await asyncio.to_thread(dns_query, _port(p), ECHO)) == [ECHO_IP]


@pytest.mark.parametrize(("sources", "held_by_proxy"), [
    pytest.param(["127.0.0.2"], 64, id="one-other-source"),
    pytest.param(["127.0.0.1"], 64, id="dig-own-source"),
    pytest.param([f"127.0.0.{i}" for i in range(2, 22)], 1024, id="twenty-sources-fill-the-cap"),
])
@pytest.mark.usefixtures("enough_fds")
async def test_dig_tcp_and_udp_are_answered_while_connections_are_held(
        tmp_path: Path, upstream: Dnsmasq, sources: list[str], held_by_proxy: int) -> None:
    """Deadlines out of reach, so only the sharing of slots makes room: 64 per address, the
    longest-idle connection giving way to a newcomer when all 1,024 are taken."""
    conf = write_resolv_conf(tmp_path / "resolv.conf", ["127.0.0.1"])
    async with running_proxy(conf, upstream.port, tcp_idle_timeout=NEVER, tcp_partial_frame_timeout=NEVER,
                             tcp_first_query_timeout=NEVER) as p:
        p.update_name_table(name_table())
        port = _port(p)
        attacked = threading.Event()
        with contextlib.ExitStack() as held:

            def attack() -> None:
                try:
                    for i in range(HELD):
                        conn = held.enter_context(_connect(port, sources[i % len(sources)]))
                        with contextlib.suppress(OSError):  # already evicted by a later one of ours
                            conn.sendall(PARTIAL)
                finally:
                    attacked.set()

            def udp_meanwhile() -> int:
                answered = 0
                while not attacked.is_set() or answered == 0:
                    assert _ips(dns_query(port, ECHO, timeout=2.0)) == [ECHO_IP]
                    answered += 1
                return answered

            _, answered = await asyncio.gather(asyncio.to_thread(attack), asyncio.to_thread(udp_meanwhile))
            assert answered > 0
            await asyncio.to_thread(
                poll, lambda: len(p.tcp_table) == held_by_proxy and p.tcp_table.evicted == HELD - held_by_proxy,
                "the proxy to have taken every attacking connection", 30.0,
                lambda: f"holding {len(p.tcp_table)}, evicted {p.tcp_table.evicted}")
            assert all(p.tcp_table.count(s) <= 64 for s in sources)
            assert p.tcp_table.refused == 0

            # the attacker still holds its 1,100 sockets; a real client gets answers meanwhile
            local = await asyncio.to_thread(dig_message, port, ECHO, "+tcp")
            assert _ips(local) == [ECHO_IP]
            forwarded = await asyncio.to_thread(dig_message, port, "www.ext.test", "+tcp")  # answered by dnsmasq
            assert _ips(forwarded) == ["1.2.3.4"]
            assert _ips(await asyncio.to_thread(dns_query, port, ECHO, tcp=True)) == [ECHO_IP]
            assert _ips(await asyncio.to_thread(dns_query, port, ECHO)) == [ECHO_IP]
            assert len(p.tcp_table) <= 1024
