"""Random and mutated packets against the live proxy over UDP and TCP.

`DNS_FUZZ_PACKETS` (default 100,000) packets are split 60/40 between UDP and
TCP; they are generated with a seeded `random.Random` (hypothesis is too slow
for that volume), and a smaller hypothesis-driven run covers shrinking-friendly
cases. After every batch a sentinel query on a separate socket must be
answered: the server neither crashed nor stalled. At the end every packet must
be accounted for in the proxy's own counters (each one is answered, forwarded,
failed, or dropped/FORMERR and counted as malformed), minus what the kernel
itself dropped for a full receive buffer (read from /proc/net/snmp).
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dns.message
import dns.rdatatype
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import free_udp_tcp_port
from test_dns_peers import name_table, write_resolv_conf

from istio_agent.dns import DnsProxy, DnsProxyOptions
from istio_agent.metrics import CollectorRegistry
from istio_agent.protos import nds_pb2

TOTAL = int(os.environ.get("DNS_FUZZ_PACKETS", "100000"))
UDP_SHARE = 0.6
BATCH = 64  # UDP datagrams per batch: small enough not to overflow the server's receive buffer
SENTINEL = "sentinel.fuzz.test."

NAMES = ["echo.ns1.svc.cluster.local.", "echo.", "api.example.com.ns1.svc.cluster.local.", "x.wild.example.com.",
         "many.example.com.", "unknown.example.org.", SENTINEL, "."]
TYPES = ["A", "AAAA", "TXT", "MX", "ANY", "PTR", "CNAME"]


def seeds(rng: random.Random) -> list[bytes]:
    out = []
    for name in NAMES:
        for rdtype in TYPES:
            for edns in (False, 0, 1):
                q = dns.message.make_query(name, dns.rdatatype.from_text(rdtype), use_edns=edns,
                                           payload=rng.choice([512, 1232, 4096]))
                out.append(q.to_wire())
    return out


def mutate(rng: random.Random, base: bytes) -> bytes:
    data = bytearray(base)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(8)
        pos = rng.randrange(len(data) + 1)
        if op == 0 and data:  # flip a bit
            data[pos % len(data)] ^= 1 << rng.randrange(8)
        elif op == 1 and data:  # random byte
            data[pos % len(data)] = rng.randrange(256)
        elif op == 2:  # insert bytes
            data[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 3 and data:  # delete a run
            del data[pos:pos + rng.randint(1, 8)]
        elif op == 4:  # truncate
            del data[pos:]
        elif op == 5 and len(data) >= 12:  # random section counts / flags
            field = rng.choice([2, 4, 6, 8, 10])
            data[field:field + 2] = rng.randbytes(2)
        elif op == 6:  # append garbage
            data += rng.randbytes(rng.randint(1, 64))
        else:  # a compression pointer somewhere
            data[pos:pos] = bytes((0xC0 | rng.randrange(64), rng.randrange(256)))
    return bytes(data)


def packets(rng: random.Random, n: int) -> Iterator[bytes]:
    base = seeds(rng)
    for _ in range(n):
        kind = rng.random()
        if kind < 0.15:
            yield rng.randbytes(rng.randint(0, 600))  # pure noise
        elif kind < 0.2:
            yield rng.choice(base)  # valid, unmodified
        else:
            yield mutate(rng, rng.choice(base))


def kernel_udp_drops() -> int:
    """System-wide UDP receive-buffer drops (an upper bound on what the proxy never saw)."""
    lines = Path("/proc/net/snmp").read_text().splitlines()
    udp = [line.split() for line in lines if line.startswith("Udp:")]
    header, values = udp[0], udp[1]
    return sum(int(values[header.index(k)]) for k in ("RcvbufErrors", "InErrors") if k in header)


class LiveProxy:
    """The proxy running on a background event loop, for synchronous (hypothesis) tests."""

    def __init__(self, tmp: Path) -> None:
        table = name_table()
        table.table[SENTINEL.rstrip(".")].CopyFrom(nds_pb2.NameInfo(ips=["192.0.2.1"], registry="External"))
        dead = free_udp_tcp_port()  # upstream refuses: forwarded queries fail fast with SERVFAIL
        conf = write_resolv_conf(tmp / "resolv.conf", ["127.0.0.1"])
        self.proxy = DnsProxy(DnsProxyOptions(addr="127.0.0.1:0", namespace="ns1", domain="ns1.svc.cluster.local",
                                              resolv_conf=str(conf), upstream_port=dead, upstream_timeout=1.0,
                                              tcp_idle_timeout=1.0), registry=CollectorRegistry())
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-agent-loop", daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self.loop).result(10)
        self.proxy.update_name_table(table)
        self.port = self.proxy.addresses[0][1]
        self.sentinel = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sentinel.settimeout(5)
        self.sentinel_id = 0

    def close(self) -> None:
        self.sentinel.close()
        asyncio.run_coroutine_threadsafe(self.proxy.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def total(self) -> int:
        return sum(v for (outcome, _), v in self.proxy.metrics.totals().items() if outcome != "upstream_failures")

    def malformed(self) -> int:
        return sum(v for (outcome, _), v in self.proxy.metrics.totals().items() if outcome == "malformed")

    def check_alive(self) -> None:
        """A known-name query on its own socket is answered (so everything sent before was read)."""
        self.sentinel_id = (self.sentinel_id + 1) & 0xFFFF
        q = dns.message.make_query(SENTINEL, "A")
        q.id = self.sentinel_id
        self.sentinel.sendto(q.to_wire(), ("127.0.0.1", self.port))
        while True:
            reply = dns.message.from_wire(self.sentinel.recv(65535))
            if reply.id == self.sentinel_id:
                assert [rd.to_text() for rrset in reply.answer for rd in rrset] == ["192.0.2.1"]
                return

    def wait_total(self, expected_min: int, expected_max: int) -> int:
        """Poll the counters until forwarded queries have finished (they are counted on completion).

        With a range (kernel drops possible) the count must also hold still for a moment.
        """
        deadline = time.monotonic() + 15
        while True:
            total = self.total()
            settled = total >= expected_min and (expected_min == expected_max or total == self._after_pause())
            if settled or time.monotonic() > deadline:
                break
            time.sleep(0.001)
        assert expected_min <= total <= expected_max, (expected_min, total, expected_max)
        return total

    def _after_pause(self) -> int:
        time.sleep(0.05)
        return self.total()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveProxy]:
    proxy = LiveProxy(tmp_path_factory.mktemp("dnsfuzz"))
    try:
        yield proxy
    finally:
        proxy.close()


def _check_reply(data: bytes) -> None:
    assert len(data) >= 12 and data[2] & 0x80, data.hex()


def test_fuzz_udp(live: LiveProxy) -> None:
    rng = random.Random(0x5EED)
    n = int(TOTAL * UDP_SHARE)
    before, drops_before, malformed_before = live.total(), kernel_udp_drops(), live.malformed()
    replies = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.setblocking(False)
        target = ("127.0.0.1", live.port)
        batch = 0
        for packet in packets(rng, n):
            client.sendto(packet, target)
            batch += 1
            if batch == BATCH:
                live.check_alive()
                batch = 0
                while True:
                    try:
                        _check_reply(client.recv(65535))
                        replies += 1
                    except BlockingIOError:
                        break
        live.check_alive()
    drops = kernel_udp_drops() - drops_before
    sentinels = n // BATCH + 1
    live.wait_total(before + n + sentinels - drops, before + n + sentinels)
    assert live.malformed() - malformed_before > n // 2  # most mutations are malformed, and counted
    assert replies > 0


def test_fuzz_tcp(live: LiveProxy) -> None:
    rng = random.Random(0xC0FFEE)
    n = TOTAL - int(TOTAL * UDP_SHARE)
    before = live.total()
    frames_per_batch = 400
    sent = 0
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as conn:
        reader = _FrameReader(conn)
        gen = packets(rng, n)
        while sent < n:
            chunk = [next(gen) for _ in range(min(frames_per_batch, n - sent))]
            sent += len(chunk)
            sentinel = dns.message.make_query(SENTINEL, "A")
            sentinel.id = sent & 0xFFFF
            chunk.append(sentinel.to_wire())
            conn.sendall(b"".join(len(p).to_bytes(2, "big") + p for p in chunk))
            reader.read_until_sentinel(sentinel.id)  # every local answer before it has been written
    live.wait_total(before + sent + n // frames_per_batch, before + sent + n // frames_per_batch + 1)
    live.check_alive()


def test_tcp_garbage_framing_is_closed_not_stuck(live: LiveProxy) -> None:
    """A connection announcing a frame it never sends is closed by the idle timeout; others carry on."""
    with socket.create_connection(("127.0.0.1", live.port), timeout=5) as stuck:
        stuck.sendall(b"\xff\xff" + b"x" * 100)
        live.check_alive()
        with socket.create_connection(("127.0.0.1", live.port), timeout=5) as other:
            q = dns.message.make_query(SENTINEL, "A")
            other.sendall(len(q.to_wire()).to_bytes(2, "big") + q.to_wire())
            _FrameReader(other).read_until_sentinel(q.id)
        stuck.settimeout(10)
        assert stuck.recv(10) == b""  # server closed the idle connection


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.binary(max_size=300),
    st.tuples(st.sampled_from(NAMES), st.integers(0, 2**31)).map(
        lambda t: mutate(random.Random(t[1]), dns.message.make_query(t[0], "A", use_edns=0).to_wire())),
))
def test_fuzz_hypothesis_udp(live: LiveProxy, packet: bytes) -> None:
    before = live.total()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.settimeout(0.001)
        client.sendto(packet, ("127.0.0.1", live.port))
        live.check_alive()
        try:
            _check_reply(client.recv(65535))
        except TimeoutError:
            pass  # dropped (counted) or forwarded (answered later)
    live.wait_total(before + 2, before + 2)


class _FrameReader:
    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = b""

    def read_until_sentinel(self, sentinel_id: int) -> None:
        while True:
            while len(self.buf) < 2 or len(self.buf) < 2 + int.from_bytes(self.buf[:2], "big"):
                chunk = self.conn.recv(65536)
                assert chunk, "server closed the connection"
                self.buf += chunk
            size = int.from_bytes(self.buf[:2], "big")
            frame, self.buf = self.buf[2:2 + size], self.buf[2 + size:]
            _check_reply(frame)
            if int.from_bytes(frame[:2], "big") == sentinel_id and SENTINEL.encode()[:8] in frame.replace(
                    b"\x08", b"."):
                try:
                    msg = dns.message.from_wire(frame)
                except Exception:
                    continue
                if msg.question and msg.question[0].name.to_text() == SENTINEL:
                    return
