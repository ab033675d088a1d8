"""SDS hardening costs: the peer-credential relay, and a running agent under hostile `file-root:` names.

(a) The relay. The SDS socket is served by an asyncio relay that reads the
    caller's SO_PEERCRED and splices to the gRPC server on a private socket.
    In this process (uvloop, as the agent), the same `SdsServer` is measured
    through its public socket and, as the peer, directly on its private socket
    (the server is told, for this benchmark only, to trust direct peers as
    root): median time of a new connection + stream + first `default` response,
    and of one more response on an open stream (unsubscribe, resubscribe).
(b) Hostile names against a real `pilot-agent proxy sidecar` (with Envoy, the
    host's sidecar ports lock held): `ROUNDS` requests naming a FIFO, /dev/zero
    and a 100 MB file, each on its own stream, against as many requests for a
    valid `file-root:` bundle. The agent's CPU time (utime + stime) per request
    of each kind, its RSS before, after the valid ones and after the hostile
    ones, and /healthz/ready latency sampled every 10 ms during each phase.

Last line: one JSON object with `relay_connect_ms`, `direct_connect_ms`,
`relay_connect_ratio`, `relay_response_ms`, `direct_response_ms`,
`relay_response_ratio`, `valid_cpu_ms_per_request`, `hostile_cpu_ms_per_request`,
`hostile_cpu_ratio`, `rss_mb_before`, `rss_mb_after_valid`, `rss_mb_after_hostile`,
`ready_ms_p50_hostile`, `ready_ms_max_hostile`, `ready_ms_max_valid`.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "component"))
import grpc
import uvloop
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.secret.v3 import sds_pb2_grpc
from launchers import IstiodLocal, PilotAgent, agent_environment, host_sidecar_ports
from support import free_port, http_request, open_workdir, poll, rss_mb

from istio_agent.pki import certs, keys
from istio_agent.security.identity import WorkloadIdentity
from istio_agent.security.options import SecurityOptions
from istio_agent.security.peercred import PeerCredentials

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "150"))
CONNECTS = int(os.environ.get("BENCH_CONNECTS", "200"))
SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
NODE_ID = "sidecar~127.0.0.1~bench.default~default.svc.cluster.local"
TICKS = os.sysconf("SC_CLK_TCK")


def request(names: list[str], nonce: str = "") -> discovery_pb2.DiscoveryRequest:
    out = discovery_pb2.DiscoveryRequest(type_url=SECRET_TYPE, resource_names=names, response_nonce=nonce)
    out.node.id = NODE_ID
    return out


def target(path: Path) -> str:
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)  # held for the process's life: long paths
    return f"unix:/proc/self/fd/{fd}/{path.name}"


async def connect_and_first_response(address: str) -> float:
    started = time.perf_counter()
    channel = grpc.aio.insecure_channel(address)
    try:
        call = sds_pb2_grpc.SecretDiscoveryServiceStub(channel).StreamSecrets()
        await call.write(request(["default"]))
        response = await call.read()
        assert response is not grpc.aio.EOF and response.resources, response
        elapsed = time.perf_counter() - started
        call.cancel()
        return elapsed
    finally:
        await channel.close()


async def responses_on_one_stream(address: str, count: int) -> list[float]:
    channel = grpc.aio.insecure_channel(address)
    times: list[float] = []
    try:
        call = sds_pb2_grpc.SecretDiscoveryServiceStub(channel).StreamSecrets()
        await call.write(request(["default"]))
        response = await call.read()
        for _ in range(count):
            started = time.perf_counter()
            await call.write(request([], response.nonce))  # unsubscribe: no answer
            await call.write(request(["default"]))  # a new watch: answered in full
            response = await call.read()
            assert response is not grpc.aio.EOF
            times.append(time.perf_counter() - started)
        call.cancel()
    finally:
        await channel.close()
    return times


async def relay_figures(workdir: Path) -> dict[str, float]:
    ca = certs.new_root_ca(keys.generate_key("ECDSA"), "cluster.local", time.time(), 86400)
    mounted = workdir / "etc/certs"
    mounted.mkdir(parents=True)
    key = keys.generate_key("ECDSA")
    spiffe = "spiffe://cluster.local/ns/default/sa/bench"
    leaf = certs.sign_workload_csr(ca, certs.load_csr(certs.build_csr(key, [spiffe])), spiffe, time.time(), 3600)
    (mounted / "cert-chain.pem").write_text(certs.cert_to_pem(leaf))
    (mounted / "key.pem").write_bytes(keys.key_to_pem(key))
    (mounted / "root-cert.pem").write_bytes(ca.cert_pem)
    identity = WorkloadIdentity(SecurityOptions(workdir=workdir, file_mounted_certs=True))
    await identity.start()
    sds = identity.sds
    assert sds is not None
    relay_caller = sds._caller
    root = PeerCredentials(0, 0, 0)
    # Benchmark only: a direct connection to the private socket is trusted as root, to measure without the relay.
    sds._caller = lambda context: relay_caller(context) or root  # type: ignore[method-assign]
    public, private = target(sds.socket_path), target(sds.private_socket_path)
    try:
        figures: dict[str, list[float]] = {"relay_connect": [], "direct_connect": []}
        for _ in range(CONNECTS):  # interleaved, so machine noise hits both alike
            figures["relay_connect"].append(await connect_and_first_response(public))
            figures["direct_connect"].append(await connect_and_first_response(private))
        relay_responses = await responses_on_one_stream(public, CONNECTS)
        direct_responses = await responses_on_one_stream(private, CONNECTS)
    finally:
        await identity.stop()
    out = {name: statistics.median(values) * 1000 for name, values in figures.items()}
    out["relay_response"] = statistics.median(relay_responses) * 1000
    out["direct_response"] = statistics.median(direct_responses) * 1000
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class ReadinessSampler:
    """/healthz/ready latency every 10 ms on a thread, while a phase runs."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            http_request("127.0.0.1", self.port, "/healthz/ready", timeout=10.0)
            self.samples.append((time.perf_counter() - started) * 1000)
            self._stop.wait(0.01)

    def __enter__(self) -> ReadinessSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)


async def ask(address: str, name: str) -> str:
    channel = grpc.aio.insecure_channel(address)
    try:
        call = sds_pb2_grpc.SecretDiscoveryServiceStub(channel).StreamSecrets()
        await call.write(request([name]))
        try:
            response = await call.read()
            return "served" if response is not grpc.aio.EOF else "eof"
        except grpc.aio.AioRpcError as exc:
            return exc.details() or exc.code().name
    finally:
        await channel.close()


def phase(agent: PilotAgent, address: str, status_port: int, names: list[str],
          check: Callable[[str], bool]) -> tuple[float, list[float]]:
    """(agent CPU seconds spent, readiness latencies) for one request per name, each on its own connection."""
    before = cpu_seconds(agent.pid)
    with ReadinessSampler(status_port) as sampler:
        async def run() -> None:
            for name in names:
                answer = await ask(address, name)
                assert check(answer), f"{name}: {answer}"
        uvloop.run(run())
    return cpu_seconds(agent.pid) - before, sampler.samples


def agent_figures(tmp: Path) -> dict[str, Any]:
    with IstiodLocal(tmp / "istiod") as istiod, host_sidecar_ports():
        pod = istiod.pod_files(tmp / "pod", service_account="sleep", pod="sleep-1")
        status_port = free_port()
        agent = PilotAgent(pod, agent_environment(pod="sleep-1", service_account="sleep",
                                                  discovery=istiod.secure_address,
                                                  proxy_config={"statusPort": status_port})).start()
        try:
            agent.wait_answering(status_port, timeout=60)  # readiness itself (Envoy) is not needed
            socket = pod / "var/run/secrets/workload-spiffe-uds/socket"
            poll(socket.exists, "the SDS socket", 30, agent.output)
            address = target(socket)
            hostile = tmp / "hostile"
            hostile.mkdir()
            os.mkfifo(hostile / "fifo.pem")
            with (hostile / "big.pem").open("wb") as handle:
                handle.truncate(100 * 1024 * 1024)
            (hostile / "root.pem").write_bytes(istiod.root_pem())
            bad = [f"file-root:{hostile / 'fifo.pem'}", "file-root:/dev/zero", f"file-root:{hostile / 'big.pem'}"]
            rss_before = rss_mb(agent.pid)
            valid_cpu, valid_ready = phase(agent, address, status_port, [f"file-root:{hostile / 'root.pem'}"] * ROUNDS,
                                           lambda answer: answer == "served")
            rss_valid = rss_mb(agent.pid)
            hostile_cpu, hostile_ready = phase(agent, address, status_port,
                                               [bad[i % len(bad)] for i in range(ROUNDS)],
                                               lambda answer: "refused" in answer or "limit" in answer)
            rss_hostile = rss_mb(agent.pid)
            assert agent.alive(), agent.output()
        finally:
            agent.kill()
    return {
        "valid_cpu_ms_per_request": valid_cpu / ROUNDS * 1000,
        "hostile_cpu_ms_per_request": hostile_cpu / ROUNDS * 1000,
        "rss_mb_before": rss_before, "rss_mb_after_valid": rss_valid, "rss_mb_after_hostile": rss_hostile,
        "ready_ms_p50_hostile": statistics.median(hostile_ready), "ready_ms_max_hostile": max(hostile_ready),
        "ready_ms_max_valid": max(valid_ready),
    }


def main() -> None:
    with open_workdir("bench-sds") as workdir:
        relay = uvloop.run(relay_figures(workdir / "relay"))
    with tempfile.TemporaryDirectory(prefix="bench-sds-agent") as tmp:
        agent = agent_figures(Path(tmp))
    print(f"new connection + first response: relay {relay['relay_connect']:.2f} ms, "
          f"direct {relay['direct_connect']:.2f} ms")
    print(f"one more response on a stream: relay {relay['relay_response']:.2f} ms, "
          f"direct {relay['direct_response']:.2f} ms")
    print(f"agent CPU per request: valid file-root {agent['valid_cpu_ms_per_request']:.2f} ms, "
          f"hostile {agent['hostile_cpu_ms_per_request']:.2f} ms")
    print(f"agent RSS: {agent['rss_mb_before']:.1f} MiB before, {agent['rss_mb_after_valid']:.1f} after "
          f"{ROUNDS} valid, {agent['rss_mb_after_hostile']:.1f} after {ROUNDS} hostile")
    print(f"/healthz/ready during hostile requests: p50 {agent['ready_ms_p50_hostile']:.1f} ms, "
          f"max {agent['ready_ms_max_hostile']:.1f} ms (valid phase max {agent['ready_ms_max_valid']:.1f} ms)")
    results = {
        "relay_connect_ms": round(relay["relay_connect"], 3), "direct_connect_ms": round(relay["direct_connect"], 3),
        "relay_connect_ratio": round(relay["relay_connect"] / relay["direct_connect"], 3),
        "relay_response_ms": round(relay["relay_response"], 3),
        "direct_response_ms": round(relay["direct_response"], 3),
        "relay_response_ratio": round(relay["relay_response"] / relay["direct_response"], 3),
        "valid_cpu_ms_per_request": round(agent["valid_cpu_ms_per_request"], 3),
        "hostile_cpu_ms_per_request": round(agent["hostile_cpu_ms_per_request"], 3),
        "hostile_cpu_ratio": round(agent["hostile_cpu_ms_per_request"] / max(agent["valid_cpu_ms_per_request"], 1e-9),
                                   3),
        **{key: round(agent[key], 1) for key in ("rss_mb_before", "rss_mb_after_valid", "rss_mb_after_hostile",
                                                 "ready_ms_p50_hostile", "ready_ms_max_hostile",
                                                 "ready_ms_max_valid")},
    }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
