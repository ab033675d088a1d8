"""XDS proxy memory under hostile streams: 200 at once, garbage, truncated and 5 MB messages, five rounds.

A real `pilot-agent proxy sidecar` with its Envoy and istiod-local (TLS + token
on 15012) run in a network namespace of their own (so the fixed sidecar ports
never clash with other runs); this process attacks the agent's
`etc/istio/proxy/XDS` socket from outside it (a Unix socket is reached by its
path). Each round opens `STREAMS` clients at once, cycling through the kinds
of `tests/xds_hostile.py` (non-HTTP/2 junk, a gRPC message that is not a
DiscoveryRequest, a 5 MB message truncated after 48 KB, by END_STREAM or by
closing the socket, and well-formed 5 MB SotW and Delta requests), and waits
for all of them to end. The agent's RSS (VmRSS of its Python process) is
read before the first round and after each, once the streams are closed and
`SETTLE` seconds have passed (longer than the agent's 15 s heap-trim period,
so a late trim cannot flatter or hide anything; the reading 2 s after the
round shows the trim the agent makes a second after streams close); the peak
during a round is sampled every 50 ms.

The peer: the same rounds against a bare grpc.aio server with grpcio's
default options (4 MB receive limit, as upstream's istiod and agent serve)
whose handler reads and drops every message, in its own process. Its RSS
after/before is the floor a Python gRPC server gets; the agent's is divided
by it (`rss_ratio_vs_grpc_server`, 1.0 = no worse than the floor).

Also counted: how often Envoy's own ADS stream was replaced (Envoy's
`cluster.xds-grpc.upstream_cx_total` growth: each new connection is a
reconnect), how many upstream streams the agent opened beyond Envoy's (its
log names each; istiod-local logs only those whose first request reached
it), and the agent's open file descriptors before and after (leaked
channels).

Needs root (a network namespace). Last line: one JSON object with
`agent_rss_mb_before`, `agent_rss_mb_after_rounds` (list), `agent_rss_mb_growth`,
`agent_rss_mb_peak`, `peer_rss_mb_growth`, `rss_ratio_vs_grpc_server`,
`envoy_reconnects`, `upstream_dials_for_hostile`, `istiod_streams_for_hostile`,
`agent_fds_growth`.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
from launchers import IstiodLocal, PilotAgent, RegistryFile, agent_environment, echo_registry, pod_files
from support import VENV_BIN, open_workdir, poll, rss_mb, stop_process
from xds_hostile import describe, hostile_round_in_child

from istio_agent.capture import netns as capture_netns

STREAMS = int(os.environ.get("BENCH_STREAMS", "200"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
SETTLE = float(os.environ.get("BENCH_SETTLE", "20"))

# A bare grpc.aio ADS server on a Unix socket, grpcio's defaults, dropping whatever it reads.
PEER = textwrap.dedent("""
    import asyncio, sys, grpc, grpc.aio

    async def handler(_it, context):
        while await context.read() is not grpc.aio.EOF:
            pass

    async def main():
        server = grpc.aio.server()
        methods = {m: grpc.stream_stream_rpc_method_handler(handler)
                   for m in ("StreamAggregatedResources", "DeltaAggregatedResources")}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "envoy.service.discovery.v3.AggregatedDiscoveryService", methods),))
        server.add_insecure_port("unix:" + sys.argv[1])
        await server.start()
        print("serving", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())
""")


def sh(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, timeout=30)


def enter_netns(name: str) -> None:
    """Move the calling thread (setns moves only the caller) into network namespace `name`."""
    capture_netns.enter_netns(f"/run/netns/{name}")


class Sampler:
    """The peak VmRSS of one process, sampled every 50 ms while running."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak = max(self.peak, rss_mb(self.pid))
            except OSError:
                return

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def attack(socket: Path, pid: int, label: str) -> tuple[float, list[float], float]:
    """ROUNDS rounds on `socket`; (RSS before, RSS after each round once settled, peak) of `pid`."""
    time.sleep(SETTLE)
    before = rss_mb(pid)
    print(f"{label}: RSS before {before:.1f} MB", flush=True)
    after, peak = [], 0.0
    for n in range(ROUNDS):
        sampler = Sampler(pid)
        started = time.monotonic()
        outcomes = hostile_round_in_child(socket, STREAMS, seed=n)
        took = time.monotonic() - started
        at_end = rss_mb(pid)
        time.sleep(2)
        soon = rss_mb(pid)
        time.sleep(max(SETTLE - 2, 0))
        peak = max(peak, sampler.stop())
        after.append(rss_mb(pid))
        print(f"{label}: round {n + 1}: {took:.1f} s, RSS {at_end:.1f} MB as the streams closed, {soon:.1f} MB "
              f"2 s later, {after[-1]:.1f} MB {SETTLE:g} s later (peak {sampler.peak:.1f})", flush=True)
        if n == 0:
            print(f"  {describe(outcomes)}", flush=True)
    return before, after, peak


def upstream_dials(agent_log: Path) -> int:
    """Upstream streams the agent opened (its log says so for each)."""
    return agent_log.read_text(errors="replace").count(") connected to ")


def ads_streams(istiod: IstiodLocal) -> int:
    """ADS streams istiod-local accepted (it logs one line when a stream's first request names its node)."""
    return sum("ADS: new" in line for line in istiod.lines)


def envoy_stat(admin: concurrent.futures.ThreadPoolExecutor, name: str) -> int:
    """One of Envoy's counters or gauges (Istio's bootstrap puts `;` after tag values: ignored here)."""
    def call() -> int:
        conn = http.client.HTTPConnection("127.0.0.1", 15000, timeout=5)
        try:
            conn.request("GET", "/stats?filter=xds-grpc")
            body = conn.getresponse().read().decode()
        finally:
            conn.close()
        for line in body.splitlines():
            key, _, value = line.partition(": ")
            if key.replace(";", "") == name:
                return int(value)
        raise KeyError(name)

    return admin.submit(call).result()


def run_agent_arm(base: Path) -> dict[str, Any]:
    netns = f"bxh-{uuid.uuid4().hex[:6]}"
    sh("ip", "netns", "add", netns)
    prefix = ["ip", "netns", "exec", netns]
    admin = concurrent.futures.ThreadPoolExecutor(1, initializer=enter_netns, initargs=(netns,))
    istiod: IstiodLocal | None = None
    agent: PilotAgent | None = None
    try:
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        registry = RegistryFile(base / "mesh.yaml", echo_registry())
        istiod = IstiodLocal(base / "istiod-state", registry=registry, prefix=prefix).start()
        pod = pod_files(istiod.state_dir, base / "pod", pod="echo-1")
        agent = PilotAgent(pod, agent_environment(discovery=istiod.secure_address), prefix=prefix,
                           log_file=base / "agent.log").start()
        admin.submit(agent.wait_ready, 60).result()
        # `ip netns exec` execs the agent, so the pid is the agent's own Python process.
        pid = agent.pid
        socket = pod / "etc/istio/proxy/XDS"
        cx_before = envoy_stat(admin, "cluster.xds-grpc.upstream_cx_total")
        ads_before, dials_before = ads_streams(istiod), upstream_dials(base / "agent.log")
        fds_before = fds(pid)
        before, after, peak = attack(socket, pid, "agent")
        reconnects = envoy_stat(admin, "cluster.xds-grpc.upstream_cx_total") - cx_before
        poll(lambda: envoy_stat(admin, "cluster.xds-grpc.upstream_cx_active") == 1, "Envoy connected again", 30)
        assert agent.alive(), agent.output()
        # Every Envoy reconnect is one upstream stream; the rest were opened for hostile streams.
        return {"before": before, "after": after, "peak": peak, "envoy_reconnects": reconnects,
                "upstream_dials_for_hostile": upstream_dials(base / "agent.log") - dials_before - reconnects,
                "istiod_streams_for_hostile": ads_streams(istiod) - ads_before - reconnects,
                "fds_growth": fds(pid) - fds_before}
    finally:
        if agent is not None:
            agent.kill()
        if istiod is not None:
            istiod.stop()
        admin.shutdown()
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)


def run_peer_arm(base: Path) -> dict[str, Any]:
    socket = base / "peer.sock"
    proc = subprocess.Popen([str(VENV_BIN / "python"), "-c", PEER, str(socket)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "serving"
        before, after, peak = attack(socket, proc.pid, "grpc.aio server")
        return {"before": before, "after": after, "peak": peak}
    finally:
        stop_process(proc)


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("needs root (a network namespace for the agent and its Envoy)")
    with open_workdir("bench-xds-hostile-") as base:
        agent = run_agent_arm(base)
        peer = run_peer_arm(base)
    growth = agent["after"][-1] - agent["before"]
    peer_growth = peer["after"][-1] - peer["before"]
    ratio = (agent["after"][-1] / agent["before"]) / (peer["after"][-1] / peer["before"])
    summary = {
        "streams_per_round": STREAMS,
        "rounds": ROUNDS,
        "agent_rss_mb_before": round(agent["before"], 1),
        "agent_rss_mb_after_rounds": [round(v, 1) for v in agent["after"]],
        "agent_rss_mb_growth": round(growth, 1),
        "agent_rss_mb_peak": round(agent["peak"], 1),
        "peer_rss_mb_before": round(peer["before"], 1),
        "peer_rss_mb_after_rounds": [round(v, 1) for v in peer["after"]],
        "peer_rss_mb_growth": round(peer_growth, 1),
        "peer_rss_mb_peak": round(peer["peak"], 1),
        "rss_ratio_vs_grpc_server": round(ratio, 3),
        "envoy_reconnects": agent["envoy_reconnects"],
        "upstream_dials_for_hostile": agent["upstream_dials_for_hostile"],
        "istiod_streams_for_hostile": agent["istiod_streams_for_hostile"],
        "agent_fds_growth": agent["fds_growth"],
    }
    print(f"agent RSS {summary['agent_rss_mb_before']} MB -> {summary['agent_rss_mb_after_rounds']} "
          f"(growth {summary['agent_rss_mb_growth']} MB, peak {summary['agent_rss_mb_peak']}); bare grpc.aio "
          f"server {summary['peer_rss_mb_before']} -> {summary['peer_rss_mb_after_rounds']} "
          f"(growth {summary['peer_rss_mb_growth']} MB); ratio {summary['rss_ratio_vs_grpc_server']}", flush=True)
    print(f"Envoy reconnected {summary['envoy_reconnects']} times over {ROUNDS * STREAMS} hostile streams; "
          f"the agent dialled istiod {summary['upstream_dials_for_hostile']} times for them and istiod "
          f"accepted {summary['istiod_streams_for_hostile']} of those streams; agent fds "
          f"{summary['agent_fds_growth']:+d}", flush=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
