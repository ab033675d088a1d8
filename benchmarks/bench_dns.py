"""DNS proxy throughput and latency against dnsmasq, with dnsperf, in one run.

Both servers answer the same known names (the proxy from a NameTable, dnsmasq
from a hosts file) and forward the same unknown names to one loopback
upstream (another dnsmasq; the dnsmasq under test runs with its cache off,
since the proxy does not cache either). Each server under test is pinned to
core 0, dnsperf and the upstream to the last core.

Figures: max QPS (dnsperf, closed loop, many outstanding queries) and p99
latency at a fixed offered rate (dnsperf -Q, per-query latencies with -v).
The two servers are measured in interleaved rounds and the best round of each
figure is kept, since other load on a shared machine only makes figures worse.
`known_qps_agent_busy` repeats the known-name QPS run while the agent's own
event loop burns CPU in 50 ms slices (a stand-in for xDS pushes): it shows what
answering on dedicated threads buys.
`silent_upstream_servfail_{udp,tcp}_ms`: how long a client waits for SERVFAIL
when the only upstream accepts queries and never answers, with a 300 ms upstream
timeout (median of 5; the component tests check only that SERVFAIL comes).

Whole agents (root): the same queries through our whole `pilot-agent` and through
upstream's Go agent, each in its own namespace with its istiod-local and its Envoy,
idle and with a push always in flight (`dns_agent_arms.py`): `agent_*` and
`upstream_*` figures, `*_vs_upstream` (ours / theirs: QPS aims >= 1.0, p99
<= 1.0) and each agent's `busy_vs_idle` (aim >= 0.8).

Usage: python benchmarks/bench_dns.py [--duration S] [--names N]
Last line: one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
from support import free_udp_tcp_port, poll, stop_process

FWD_DOMAIN = "fwd.test"
LATENCY_RATE = 5_000  # offered queries/s for the p99 runs: well below both servers' capacity
LOST_LATENCY = 5.0  # dnsperf's default timeout: what an unanswered query counts as


def _known_names(n: int) -> list[tuple[str, str]]:
    return [(f"svc{i}.ns{i % 10}.svc.cluster.local", f"10.96.{i // 250}.{i % 250 + 1}") for i in range(n)]


def _pin(core: int | None) -> list[str]:
    taskset = shutil.which("taskset")
    if core is None or taskset is None:
        return []
    return [taskset, "-c", str(core)]


def _query_wire(name: str, qid: int = 0xABCD) -> bytes:
    """A plain recursive A query for `name` (no EDNS)."""
    return (qid.to_bytes(2, "big") + bytes.fromhex("01000001000000000000")
            + b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\x00\x00\x01\x00\x01")


def _wait_udp(port: int, deadline_s: float = 10.0) -> None:
    # svc0.ns0.svc.cluster.local A: known to every server under test; the upstream answers REFUSED
    query = _query_wire(_known_names(1)[0][0])

    def answered() -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(0.2)
            s.sendto(query, ("127.0.0.1", port))
            return bool(s.recv(4096))

    poll(answered, f"a DNS answer on port {port}", deadline_s, retry_on=(OSError,))


@contextlib.contextmanager
def _process(argv: list[str], port: int, *, stdin: int | None = None) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_udp(port)
        yield proc
    finally:
        stop_process(proc)


def _dnsmasq(port: int, core: int | None, extra: list[str]) -> list[str]:
    binary = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
    return [*_pin(core), binary, "--no-daemon", "--conf-file=/dev/null", f"--port={port}",
            "--listen-address=127.0.0.1", "--bind-interfaces", "--no-hosts", "--pid-file=",
            "--log-facility=/dev/null", *extra]


def _dnsperf(port: int, queries: Path, duration: float, core: int | None, prefix: list[str] | None = None) -> float:
    """Max QPS (closed loop); `prefix` (a namespace and pinning of its own) in place of pinning to `core`."""
    launcher = _pin(core) if prefix is None else prefix
    out = subprocess.run([*launcher, "dnsperf", "-s", "127.0.0.1", "-p", str(port), "-d", str(queries),
                          "-l", str(duration), "-c", "8", "-q", "400"], capture_output=True, text=True,
                         check=True).stdout
    match = re.search(r"Queries per second:\s+([\d.]+)", out)
    if not match:
        raise RuntimeError(f"dnsperf output not understood:\n{out}")
    lost = re.search(r"Queries lost:\s+(\d+)", out)
    if lost and int(lost.group(1)) > 0:
        print(f"  (dnsperf lost {lost.group(1)} queries)", file=sys.stderr)
    return float(match.group(1))


def _p99(port: int, queries: Path, duration: float, core: int | None, prefix: list[str] | None = None) -> float:
    log = queries.with_suffix(".latencies")
    launcher = _pin(core) if prefix is None else prefix
    with log.open("w") as sink:  # a file, not a pipe: dnsperf must not wait on our reading
        subprocess.run([*launcher, "dnsperf", "-s", "127.0.0.1", "-p", str(port), "-d", str(queries),
                        "-l", str(duration), "-c", "4", "-q", "200", "-Q", str(LATENCY_RATE), "-v"],
                       stdout=sink, stderr=subprocess.DEVNULL, check=True)
    out = log.read_text()
    latencies = []
    lost = 0
    for line in out.splitlines():
        if line.startswith("> T "):
            lost += 1
            latencies.append(LOST_LATENCY)  # unanswered within dnsperf's timeout
        elif line.startswith("> "):
            latencies.append(float(line.rsplit(" ", 1)[1]))
    if not latencies:
        raise RuntimeError(f"no latencies in dnsperf output:\n{out[:2000]}")
    if lost:
        print(f"  ({lost} of {len(latencies)} queries unanswered in the latency run)", file=sys.stderr)
    return statistics.quantiles(sorted(latencies), n=100)[98]


# ---- the proxy under test (a separate, pinned process) ---------------------------------------------


async def _serve(port: int, resolv_conf: str, upstream_port: int, names: int, busy: bool, same_loop: bool) -> None:
    from istio_agent.dns import DnsProxy, DnsProxyOptions
    from istio_agent.metrics import CollectorRegistry
    from istio_agent.protos import nds_pb2

    table = nds_pb2.NameTable()
    for host, ip in _known_names(names):
        name, namespace = host.split(".")[:2]
        table.table[host].CopyFrom(nds_pb2.NameInfo(ips=[ip], registry="Kubernetes", shortname=name,
                                                    namespace=namespace))
    proxy = DnsProxy(DnsProxyOptions(addr=f"127.0.0.1:{0 if same_loop else port}", namespace="ns0",
                                     domain="ns0.svc.cluster.local", resolv_conf=resolv_conf,
                                     upstream_port=upstream_port), registry=CollectorRegistry())
    await proxy.start()
    proxy.update_name_table(table)
    if same_loop:  # the rejected design: the same responder, answering on the agent's own loop
        await _same_loop_endpoint(proxy, port)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        if busy:  # the agent's loop doing 50 ms of CPU work at a time
            end = time.perf_counter() + 0.05
            x = 0
            while time.perf_counter() < end:
                for i in range(1000):
                    x += i
        await asyncio.sleep(0.001 if busy else 0.5)
    await proxy.stop()


async def _same_loop_endpoint(proxy: object, port: int) -> None:
    from istio_agent.dns.core.responder import Responder

    responder: Responder = proxy.responder  # type: ignore[attr-defined]
    counts = [0] * 5

    class Endpoint(asyncio.DatagramProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
            out = responder.respond(data, False, counts)
            if type(out) is bytes:
                self.transport.sendto(out, addr)  # type: ignore[attr-defined]

    await asyncio.get_running_loop().create_datagram_endpoint(Endpoint, local_addr=("127.0.0.1", port))


def _serve_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--resolv-conf", required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--names", type=int, required=True)
    parser.add_argument("--busy", action="store_true")
    parser.add_argument("--same-loop", action="store_true")
    args = parser.parse_args(argv)
    from istio_agent.eventloop import new_event_loop

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(_serve(args.port, args.resolv_conf, args.upstream_port, args.names, args.busy, args.same_loop))


def _proxy_argv(core: int | None, port: int, resolv_conf: Path, upstream_port: int, names: int,
                busy: bool, same_loop: bool = False) -> list[str]:
    argv = [*_pin(core), sys.executable, __file__, "--serve", "--port", str(port), "--resolv-conf",
            str(resolv_conf), "--upstream-port", str(upstream_port), "--names", str(names)]
    return argv + (["--busy"] if busy else []) + (["--same-loop"] if same_loop else [])


# ---- time to SERVFAIL with a silent upstream (in this process) --------------------------------------


SILENT_UPSTREAM_TIMEOUT = 0.3  # the proxy's per-server upstream timeout for this run


def _servfail_after(port: int, qid: int, tcp: bool) -> float:
    """Seconds from sending one forwarded query to the proxy's SERVFAIL (UDP or TCP)."""
    query = _query_wire(f"q{qid}.{FWD_DOMAIN}", qid)
    if tcp:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            start = time.perf_counter()
            conn.sendall(len(query).to_bytes(2, "big") + query)
            reply = b""
            while len(reply) < 2 or len(reply) < 2 + int.from_bytes(reply[:2], "big"):
                chunk = conn.recv(65536)
                if not chunk:
                    raise RuntimeError("the proxy closed the TCP connection without an answer")
                reply += chunk
            elapsed = time.perf_counter() - start
            reply = reply[2:]
    else:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(10)
            start = time.perf_counter()
            s.sendto(query, ("127.0.0.1", port))
            reply = s.recv(65535)
            elapsed = time.perf_counter() - start
    if reply[:2] != query[:2] or reply[3] & 0x0F != 2:
        raise RuntimeError(f"expected SERVFAIL for query {qid}, got {reply[:4].hex()}")
    return elapsed


async def _silent_upstream_servfail(tmp: Path, queries: int) -> dict[str, float]:
    """Median time to SERVFAIL over UDP and TCP when the only upstream accepts queries and never answers.

    The proxy should give up right after its upstream timeout; the figure shows
    by how much it overshoots. No peer: dnsmasq keeps retrying a silent server
    instead of answering SERVFAIL, so there is nothing like-for-like to compare.
    """
    from istio_agent.dns import DnsProxy, DnsProxyOptions
    from istio_agent.metrics import CollectorRegistry
    from istio_agent.protos import nds_pb2

    port = free_udp_tcp_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp_hole, \
            socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp_hole:
        udp_hole.bind(("127.0.0.1", port))
        tcp_hole.bind(("127.0.0.1", port))
        tcp_hole.listen(64)  # accepted by the kernel, never read
        resolv_conf = tmp / "silent-resolv.conf"
        resolv_conf.write_text("nameserver 127.0.0.1\n")
        proxy = DnsProxy(DnsProxyOptions(addr="127.0.0.1:0", resolv_conf=str(resolv_conf), upstream_port=port,
                                         upstream_timeout=SILENT_UPSTREAM_TIMEOUT), registry=CollectorRegistry())
        await proxy.start()
        try:
            proxy.update_name_table(nds_pb2.NameTable())  # synced, so unknown names go upstream
            proxy_port = proxy.addresses[0][1]
            out = {}
            for label, tcp in (("udp", False), ("tcp", True)):
                times = [await asyncio.to_thread(_servfail_after, proxy_port, i + 1, tcp) for i in range(queries)]
                out[label] = statistics.median(times)
            return out
        finally:
            await proxy.stop()


# ---- whole agents: ours and upstream's Go one (dns_agent_arms.py) -----------------------------------


AGENT_FIGURES = ("known_qps", "forward_qps", "known_p99", "forward_p99", "known_qps_busy")


def _agents(tmp: Path, args: argparse.Namespace, known: Path, forwarded: Path, server_core: int | None,
            client_core: int | None) -> dict[str, float | str | None]:
    """Each whole agent's figures (best of `args.rounds` interleaved rounds), ours / upstream's, and each one's
    QPS with a push in flight over its own idle QPS."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from dns_agent_arms import AGENT_DNS_PORT, AgentDnsArm
    from upstream_arm import GO, OURS, missing, ratio, say_missing

    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("whole agents not measured: they need root and iproute2 (a network namespace each)", flush=True)
        return {"agents": "needs root"}
    why_not = missing("pilot-agent")
    if why_not:
        say_missing("bench_dns", why_not)
    upstream = _dnsmasq(53, None, ["--no-resolv", f"--address=/{FWD_DOMAIN}/192.0.2.7"])
    (tmp / "agents").mkdir()
    arms = [AgentDnsArm(name, tmp / "agents", _known_names(args.names), server_core, client_core,
                        _pin(server_core), upstream) for name in ([OURS] if why_not else [OURS, GO])]
    from launchers import pod_files

    pod_files(tmp / "agents" / "state", tmp / "agents" / "state-pod")  # the shared CA before any istiod
    runs: dict[str, list[float]] = {}
    try:
        for arm in arms:
            arm.start()
        for arm in arms:  # warm-up
            _dnsperf(AGENT_DNS_PORT, known, 1.0, None, arm.prefix())
        for round_no in range(args.rounds):
            for arm in arms if round_no % 2 == 0 else arms[::-1]:
                name, prefix = arm.implementation, arm.prefix()
                runs.setdefault(f"{name}_known_qps", []).append(
                    _dnsperf(AGENT_DNS_PORT, known, args.duration, None, prefix))
                runs.setdefault(f"{name}_forward_qps", []).append(
                    _dnsperf(AGENT_DNS_PORT, forwarded, args.duration, None, prefix))
                runs.setdefault(f"{name}_known_p99", []).append(_p99(AGENT_DNS_PORT, known, 2.0, None, prefix))
                runs.setdefault(f"{name}_forward_p99", []).append(_p99(AGENT_DNS_PORT, forwarded, 2.0, None, prefix))
                with arm.busy() as flips:
                    time.sleep(1.0)  # the first push under way
                    runs.setdefault(f"{name}_known_qps_busy", []).append(
                        _dnsperf(AGENT_DNS_PORT, known, args.duration, None, prefix))
                    if flips[0] < 2:
                        print(f"  ({name}: only {flips[0]} registry flips during the busy run)", file=sys.stderr)
    finally:
        for arm in arms:
            arm.stop()
    best = {key: (min(values) if key.endswith("_p99") else max(values)) for key, values in runs.items()}
    out: dict[str, float | str | None] = {}
    for arm in arms:
        name = arm.implementation
        label = "whole agent (ours)" if name == OURS else "upstream's Go agent"
        print(f"{label:22s} known: {best[f'{name}_known_qps']:9.0f} qps  p99 {best[f'{name}_known_p99'] * 1e3:6.3f} "
              f"ms   forwarded: {best[f'{name}_forward_qps']:9.0f} qps  p99 {best[f'{name}_forward_p99'] * 1e3:6.3f} ms"
              f"   known with a push in flight: {best[f'{name}_known_qps_busy']:9.0f} qps "
              f"({best[f'{name}_known_qps_busy'] / best[f'{name}_known_qps']:.2f}x its idle)", flush=True)
        key = "agent_" if name == OURS else "upstream_"
        for figure in AGENT_FIGURES:
            value = best[f"{name}_{figure}"]
            out[key + figure] = round(value * 1e3, 3) if figure.endswith("_p99") else round(value)
        out[f"{key}busy_vs_idle"] = ratio(best[f"{name}_known_qps_busy"], best[f"{name}_known_qps"])
    if why_not:
        out["upstream"] = why_not
    else:
        for figure in AGENT_FIGURES:
            out[f"{figure}_vs_upstream"] = ratio(best[f"{OURS}_{figure}"], best[f"{GO}_{figure}"])
        print("whole agents, ours / upstream's: " + ", ".join(
            f"{figure} {out[f'{figure}_vs_upstream']}" for figure in AGENT_FIGURES), flush=True)
    return out


# ---- orchestration ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per QPS run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per server (best kept)")
    parser.add_argument("--names", type=int, default=1000, help="known names in the table")
    args = parser.parse_args()
    search_path = os.environ.get("PATH", "") + ":/usr/sbin"
    if shutil.which("dnsperf") is None or shutil.which("dnsmasq", path=search_path) is None:
        raise SystemExit("bench_dns needs dnsperf and dnsmasq")
    cores = os.cpu_count() or 1
    server_core, client_core = (0, cores - 1) if cores > 1 else (None, None)

    with tempfile.TemporaryDirectory(prefix="bench-dns-") as tmp_name:
        tmp = Path(tmp_name)
        names = _known_names(args.names)
        (tmp / "hosts").write_text("".join(f"{ip} {host}\n" for host, ip in names))
        known = tmp / "known.txt"
        known.write_text("".join(f"{host} A\n" for host, _ in names))
        forwarded = tmp / "forwarded.txt"
        forwarded.write_text("".join(f"q{i}.{FWD_DOMAIN} A\n" for i in range(args.names)))
        resolv_conf = tmp / "resolv.conf"
        resolv_conf.write_text("nameserver 127.0.0.1\nsearch ns0.svc.cluster.local svc.cluster.local cluster.local\n")

        upstream_port, dnsmasq_port, proxy_port = free_udp_tcp_port(), free_udp_tcp_port(), free_udp_tcp_port()
        upstream = _dnsmasq(upstream_port, client_core, ["--no-resolv", f"--address=/{FWD_DOMAIN}/192.0.2.7"])
        dnsmasq = _dnsmasq(dnsmasq_port, server_core, [f"--addn-hosts={tmp / 'hosts'}", "--no-resolv",
                                                        f"--server=127.0.0.1#{upstream_port}", "--cache-size=0"])
        proxy = _proxy_argv(server_core, proxy_port, resolv_conf, upstream_port, args.names, busy=False)
        runs: dict[str, list[float]] = {}
        with _process(upstream, upstream_port), _process(dnsmasq, dnsmasq_port), _process(proxy, proxy_port):
            for port in (proxy_port, dnsmasq_port):
                _dnsperf(port, known, 1.0, client_core)  # warm-up
            # Interleave the two servers round by round: the machine may be shared.
            for _ in range(args.rounds):
                for label, port in (("proxy", proxy_port), ("dnsmasq", dnsmasq_port)):
                    runs.setdefault(f"{label}_known_qps", []).append(
                        _dnsperf(port, known, args.duration, client_core))
                    runs.setdefault(f"{label}_forward_qps", []).append(
                        _dnsperf(port, forwarded, args.duration, client_core))
                    runs.setdefault(f"{label}_known_p99", []).append(_p99(port, known, 2.0, client_core))
                    runs.setdefault(f"{label}_forward_p99", []).append(_p99(port, forwarded, 2.0, client_core))
        # Best round per figure: load from elsewhere on the machine only ever lowers QPS and raises
        # latency, so the least disturbed round is the best estimate of the server itself.
        results = {key: (min(values) if key.endswith("_p99") else max(values)) for key, values in runs.items()}
        for label in ("proxy", "dnsmasq"):
            print(f"{label:8s} known: {results[f'{label}_known_qps']:9.0f} qps  "
                  f"p99 {results[f'{label}_known_p99'] * 1e3:6.3f} ms @ {LATENCY_RATE}/s   "
                  f"forwarded: {results[f'{label}_forward_qps']:9.0f} qps  "
                  f"p99 {results[f'{label}_forward_p99'] * 1e3:6.3f} ms @ {LATENCY_RATE}/s   "
                  f"(best of {args.rounds} rounds)", flush=True)
        # The threading decision, measured: the agent's loop burning CPU in 50 ms slices, with
        # answers on the proxy's own threads vs on that same loop.
        for key, same_loop in (("proxy_known_qps_agent_busy", False), ("same_loop_known_qps_agent_busy", True)):
            busy_port = free_udp_tcp_port()
            argv = _proxy_argv(server_core, busy_port, resolv_conf, upstream_port, args.names, busy=True,
                               same_loop=same_loop)
            with _process(upstream, upstream_port), _process(argv, busy_port):
                results[key] = _dnsperf(busy_port, known, args.duration, client_core)
        print(f"agent loop busy (50 ms CPU slices), known names: own threads "
              f"{results['proxy_known_qps_agent_busy']:9.0f} qps, answering on the agent loop "
              f"{results['same_loop_known_qps_agent_busy']:9.0f} qps", flush=True)
        silent = asyncio.run(_silent_upstream_servfail(tmp, 5))
        print(f"silent upstream (timeout {SILENT_UPSTREAM_TIMEOUT * 1e3:.0f} ms): SERVFAIL after "
              f"{silent['udp'] * 1e3:6.1f} ms over UDP, {silent['tcp'] * 1e3:6.1f} ms over TCP (median of 5)",
              flush=True)
        agents = _agents(tmp, args, known, forwarded, server_core, client_core)

    known_ratio = results["proxy_known_qps"] / results["dnsmasq_known_qps"]
    summary = {
        "known_qps_ratio": round(known_ratio, 3),
        "known_p99_ratio": round(results["proxy_known_p99"] / results["dnsmasq_known_p99"], 3),
        "forward_qps_ratio": round(results["proxy_forward_qps"] / results["dnsmasq_forward_qps"], 3),
        "forward_p99_ratio": round(results["proxy_forward_p99"] / results["dnsmasq_forward_p99"], 3),
        "known_qps": round(results["proxy_known_qps"]),
        "dnsmasq_qps": round(results["dnsmasq_known_qps"]),
        "forward_qps": round(results["proxy_forward_qps"]),
        "dnsmasq_forward_qps": round(results["dnsmasq_forward_qps"]),
        "known_qps_agent_busy": round(results["proxy_known_qps_agent_busy"]),
        "same_loop_known_qps_agent_busy": round(results["same_loop_known_qps_agent_busy"]),
        "dns_qps_ratio_vs_dnsmasq": round(known_ratio, 3),
        "silent_upstream_servfail_udp_ms": round(silent["udp"] * 1e3, 1),
        "silent_upstream_servfail_tcp_ms": round(silent["tcp"] * 1e3, 1),
        **agents,
    }
    print(f"known-name QPS ratio vs dnsmasq: {summary['known_qps_ratio']}  "
          f"p99 ratio: {summary['known_p99_ratio']}  forwarded QPS ratio: {summary['forward_qps_ratio']}")
    print(json.dumps(summary))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        _serve_main(sys.argv[2:])
    else:
        main()
