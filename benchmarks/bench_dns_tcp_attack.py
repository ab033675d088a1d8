"""DNS over TCP while an attacker holds 1,100 connections open: what the proxy keeps, what a client waits.

The attacker (a child process, pinned to the last core) opens 1,100 TCP
connections from 20 loopback addresses, more than the proxy's 1,024 slots,
each sending 10 bytes of a 50-byte frame and nothing more; whenever the
proxy closes one (deadline or eviction) it opens another at once, so 1,100
are always open on its side. The proxy runs in this process with its default
options (3 s first-query and partial-frame deadlines, 64 connections per
address, the longest-idle connection giving way to a newcomer).

Figures, unloaded and under the attack (medians):
- `dig +tcp` of a local name, wall time of the real /usr/bin/dig (process
  start included, so the ratio understates the change a resolver inside a
  running app would see);
- one TCP query from a raw socket (connect, query, answer, close);
and as ratios (under attack / unloaded), how many attacking connections the
proxy held (sampled), how many it evicted and refused, how many dig runs
failed, and the share of UDP queries answered during the attack. Since a
newcomer takes an idle slot rather than being refused, an attacker with
more connections than slots makes the proxy evict as fast as it can accept
(each eviction is answered by a reconnect): `tcp_attack_evicted_per_s` is
that churn, the price of never locking a real client out. No peer:
dnsmasq serves TCP from a fixed number of forked children (20 by default),
a different design with no like-for-like figure to divide by.

Usage: python benchmarks/bench_dns_tcp_attack.py [--runs N]
Last line: one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
from support import poll, stop_process

HELD = 1100
SOURCES = [f"127.0.0.{i}" for i in range(2, 22)]
PARTIAL = (50).to_bytes(2, "big") + b"x" * 8
NAME = "echo.ns1.svc.cluster.local"
IP = "10.96.0.20"
FDS = 4096


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < FDS:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FDS if hard == resource.RLIM_INFINITY else min(FDS, hard), hard))


def _query_wire(name: str, qid: int) -> bytes:
    return (qid.to_bytes(2, "big") + bytes.fromhex("01000001000000000000")
            + b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\x00\x00\x01\x00\x01")


# ---- the attacker (a child process) ----------------------------------------------------------------


def _attack_main(port: int) -> None:
    """Keep HELD dripping connections open against 127.0.0.1:port until killed."""
    _raise_fd_limit()
    sel = selectors.DefaultSelector()

    def open_one(i: int) -> None:
        while True:
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                conn.bind((SOURCES[i % len(SOURCES)], 0))
                conn.connect(("127.0.0.1", port))
                conn.sendall(PARTIAL)
            except OSError:  # closed by the proxy before the bytes went out: try again
                conn.close()
                continue
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ, i)
            return

    for i in range(HELD):
        open_one(i)
    while True:
        for key, _ in sel.select():
            conn = key.fileobj
            assert isinstance(conn, socket.socket)
            try:
                data = conn.recv(4096)
            except OSError:
                data = b""
            if not data:
                sel.unregister(conn)
                conn.close()
                open_one(key.data)


# ---- the measurements (this process) -----------------------------------------------------------------


def _dig_once(port: int) -> float | None:
    """Wall time of one `dig +tcp` answered with the right address, None when it failed."""
    start = time.perf_counter()
    out = subprocess.run(["/usr/bin/dig", "@127.0.0.1", "-p", str(port), "+tcp", "+tries=1", "+time=3", "+short",
                          NAME], capture_output=True, text=True, timeout=30).stdout
    elapsed = time.perf_counter() - start
    return elapsed if out.split() == [IP] else None


def _tcp_query_once(port: int, qid: int) -> float | None:
    query = _query_wire(NAME, qid)
    start = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(len(query).to_bytes(2, "big") + query)
            reply = b""
            while len(reply) < 2 or len(reply) < 2 + int.from_bytes(reply[:2], "big"):
                chunk = conn.recv(65536)
                if not chunk:
                    return None
                reply += chunk
    except OSError:
        return None
    elapsed = time.perf_counter() - start
    return elapsed if reply[2:4] == query[:2] else None


def _udp_answered(port: int, count: int) -> float:
    """Share of `count` UDP queries answered within 1 s each."""
    answered = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(1.0)
        for qid in range(count):
            query = _query_wire(NAME, qid)
            sock.sendto(query, ("127.0.0.1", port))
            try:
                while sock.recv(4096)[:2] != query[:2]:  # a late answer to an earlier query
                    pass
                answered += 1
            except TimeoutError:
                pass
    return answered / count


def _measure(port: int, runs: int) -> dict[str, float]:
    """Median dig and raw-TCP latencies (failures counted apart) and the UDP answer share, at `port` now."""
    digs = [_dig_once(port) for _ in range(runs)]
    queries = [_tcp_query_once(port, i) for i in range(runs * 10)]
    ok_digs = [d for d in digs if d is not None]
    ok_queries = [q for q in queries if q is not None]
    return {
        "dig_ms": statistics.median(ok_digs) * 1e3 if ok_digs else float("nan"),
        "dig_failures": len(digs) - len(ok_digs),
        "query_ms": statistics.median(ok_queries) * 1e3 if ok_queries else float("nan"),
        "query_failures": len(queries) - len(ok_queries),
        "udp_answered": _udp_answered(port, 200),
    }


@dataclass(frozen=True)
class AttackRun:
    unloaded: dict[str, float]
    loaded: dict[str, float]
    held: float  # median of the proxy's open connections, sampled every 100 ms under attack
    evicted_per_s: float
    refused: int


async def _run(runs: int, attacker_core: int | None) -> AttackRun:
    from istio_agent.dns import DnsProxy, DnsProxyOptions
    from istio_agent.metrics import CollectorRegistry
    from istio_agent.protos import nds_pb2

    with tempfile.TemporaryDirectory(prefix="bench-dns-tcp-") as tmp:
        resolv_conf = Path(tmp) / "resolv.conf"
        resolv_conf.write_text("nameserver 127.0.0.1\nsearch ns1.svc.cluster.local svc.cluster.local\n")
        proxy = DnsProxy(DnsProxyOptions(addr="127.0.0.1:0", namespace="ns1", domain="ns1.svc.cluster.local",
                                         resolv_conf=str(resolv_conf), upstream_port=9),
                         registry=CollectorRegistry())
        await proxy.start()
        try:
            table = nds_pb2.NameTable()
            table.table[NAME].CopyFrom(nds_pb2.NameInfo(ips=[IP], registry="Kubernetes", shortname="echo",
                                                        namespace="ns1"))
            proxy.update_name_table(table)
            port = proxy.addresses[0][1]
            unloaded = await asyncio.to_thread(_measure, port, runs)
            taskset = shutil.which("taskset")
            pin = [taskset, "-c", str(attacker_core)] if taskset and attacker_core is not None else []
            attacker = subprocess.Popen([*pin, sys.executable, __file__, "--attack", str(port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                conns = proxy.tcp_table
                await asyncio.to_thread(poll, lambda: len(conns) >= 1000, "the attack to fill the proxy's slots", 60.0)
                samples: list[int] = []
                sampling = threading.Event()

                def sample() -> None:
                    while not sampling.wait(0.1):
                        samples.append(len(conns))

                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
                evicted, refused, start = conns.evicted, conns.refused, time.perf_counter()
                loaded = await asyncio.to_thread(_measure, port, runs)
                elapsed = time.perf_counter() - start
                sampling.set()
                sampler.join()
                if attacker.poll() is not None:
                    err = attacker.stderr.read().decode() if attacker.stderr else ""
                    raise RuntimeError(f"the attacker exited: {err}")
            finally:
                stop_process(attacker)
        finally:
            await proxy.stop()
    return AttackRun(unloaded, loaded, statistics.median(samples) if samples else 0.0,
                     (conns.evicted - evicted) / elapsed, conns.refused - refused)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15, help="dig runs per phase (raw TCP queries: 10x)")
    args = parser.parse_args()
    _raise_fd_limit()
    cores = os.cpu_count() or 1
    r = asyncio.run(_run(args.runs, cores - 1 if cores > 1 else None))
    unloaded, loaded = r.unloaded, r.loaded
    summary = {
        "tcp_attack_connections": HELD,
        "tcp_attack_held_by_proxy": round(r.held),
        "tcp_attack_evicted_per_s": round(r.evicted_per_s, 1),
        "tcp_attack_refused": r.refused,
        "tcp_dig_ms_unloaded": round(unloaded["dig_ms"], 2),
        "tcp_dig_ms_under_attack": round(loaded["dig_ms"], 2),
        "tcp_dig_latency_ratio_under_attack": round(loaded["dig_ms"] / unloaded["dig_ms"], 3),
        "tcp_dig_failures_under_attack": loaded["dig_failures"],
        "tcp_query_ms_unloaded": round(unloaded["query_ms"], 3),
        "tcp_query_ms_under_attack": round(loaded["query_ms"], 3),
        "tcp_query_latency_ratio_under_attack": round(loaded["query_ms"] / unloaded["query_ms"], 3),
        "tcp_query_failures_under_attack": loaded["query_failures"],
        "udp_answered_share_under_attack": round(loaded["udp_answered"], 3),
    }
    print(f"{HELD} attacking TCP connections from {len(SOURCES)} addresses: proxy held "
          f"{summary['tcp_attack_held_by_proxy']} (median), evicted {summary['tcp_attack_evicted_per_s']}/s, "
          f"refused {summary['tcp_attack_refused']}", flush=True)
    print(f"dig +tcp: {summary['tcp_dig_ms_unloaded']} ms unloaded, {summary['tcp_dig_ms_under_attack']} ms under "
          f"attack (ratio {summary['tcp_dig_latency_ratio_under_attack']}, "
          f"{summary['tcp_dig_failures_under_attack']} of {args.runs} failed); raw TCP query "
          f"{summary['tcp_query_ms_unloaded']} -> {summary['tcp_query_ms_under_attack']} ms "
          f"(ratio {summary['tcp_query_latency_ratio_under_attack']}); UDP answered "
          f"{summary['udp_answered_share_under_attack']:.1%}", flush=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--attack":
        _attack_main(int(sys.argv[2]))
    else:
        main()
