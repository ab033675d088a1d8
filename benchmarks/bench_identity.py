"""Identity and start-up benchmark (issue 2; upstream's Go agent beside ours, issue 25).

Every arm runs in one network namespace with one istiod-local (15010/15012),
through the same `ip netns exec` prefix (needs root), so that upstream's Go agent's
fixed ports (15004, 15020, 15021, ...) meet nothing of the host's.

(a) Time from `pilot-agent proxy` start to its first certificate on disk
    (DISABLE_ENVOY, OUTPUT_CERTS), for ECDSA and RSA, against
    `minimal_ca_client.py` (a fresh Python process that only makes a key and
    CSR, calls istiod-local and writes the files) and against upstream's Go
    agent started the same way. Interleaved rounds, medians compared, so
    machine noise hits every side alike. An RSA key takes 40-200 ms to
    generate (the prime search varies), on every side: 15 rounds by default
    (BENCH_ROUNDS) so that the medians settle.

    Where our agent's time goes (timestamps from spawn, 2 cores, RSA, before
    the first key was made ahead): interpreter ~20 ms, the agent's imports and
    options to `run_agent` ~230-280 ms, identity stage ~15-30 ms, then the key
    (40-100 ms) and CSR on a thread, the CA call ~10-15 ms, and the check of
    the issued certificate against its key (~45 ms when it parsed the RSA PEM
    back) before the files. Now the key is made on a thread from the CLI's
    start, beside the imports (`security/key_ahead.py`), and checked as the
    object it is; what remains over the minimal client is imports.
(b) Start to Envoy ready: `pilot-agent proxy sidecar` (DNS proxy on) from
    spawn to Envoy's :15021/healthz/ready answering 200, ours and the Go
    agent's, the same Envoy binary (`upstream_arm.py`), interleaved
    (BENCH_READY_ROUNDS, 7).
(c) Rotation: both agents at once (DISABLE_ENVOY, ECDSA, SECRET_TTL
    `BENCH_ROTATION_TTL` 20 s, no jitter) for `BENCH_ROTATION_SECONDS` (60):
    how late each new certificate reaches the disk after its rotation was due
    (expiry - ratio x lifetime, the lifetime counted from when the previous one
    was written, as both agents count it), and the agent's CPU per rotation
    (its whole CPU over the window, idle work included, / rotations).
(d) istiod-local signing throughput with 1 and 50 concurrent clients (ECDSA).

Prints each figure on its own line and, last, one JSON object: `time_to_cert_ratio_{ecdsa,rsa}` (vs the
minimal client), `time_to_cert_{ecdsa,rsa}_vs_upstream`, `start_to_ready_vs_upstream`,
`rotation_late_ms_vs_upstream`, `rotation_cpu_vs_upstream`, `start_cpu_vs_upstream` (the agent's CPU by
the time Envoy is ready), `minimal_client_{ecdsa,rsa}_vs_upstream` (the minimal Python client against the
Go agent: what no Python agent gets under) and the figures they come from (`"upstream":
"<why>"` in place of upstream's when its commands are missing).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_xds import Arm, cpu_seconds
from cryptography import x509
from launchers import agent_environment, pod_files
from support import HTTP_NOT_YET, compile_sources, poll
from upstream_arm import GO, OURS, missing, ratio, say_missing, sidecar_environment, start_agent

HERE = Path(__file__).resolve().parent
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "15"))
READY_ROUNDS = int(os.environ.get("BENCH_READY_ROUNDS", "7"))
ROTATION_TTL = float(os.environ.get("BENCH_ROTATION_TTL", "20"))
ROTATION_SECONDS = float(os.environ.get("BENCH_ROTATION_SECONDS", "60"))
ADDRESS = "localhost:15012"


def cert_agent_environment(algorithm: str, out: Path, status_port: int, **extra: str) -> dict[str, str]:
    environment = agent_environment(
        pod="sleep-1", service_account="sleep", discovery=ADDRESS, DISABLE_ENVOY="true", OUTPUT_CERTS=str(out),
        SECRET_TTL="1h", ECC_SIGNATURE_ALGORITHM="ECDSA" if algorithm == "ECDSA" else "",
        # A status port of its own, so that two agents of the rotation run do not meet.
        PROXY_CONFIG=json.dumps({"statusPort": status_port, "discoveryAddress": ADDRESS}))
    environment.update(extra)
    return environment


def time_agent(arm: Arm, implementation: str, pod: Path, algorithm: str, out: Path) -> float:
    out.mkdir(parents=True)  # the template's volume: upstream's agent does not make it
    environment = cert_agent_environment(algorithm, out, 15020)
    chain = out / "cert-chain.pem"
    start = time.perf_counter()
    agent = start_agent(implementation, pod, environment, prefix=arm.prefix())
    try:
        poll(lambda: chain.exists() and (out / "root-cert.pem").exists(), "the certificate files", 60,
             agent.output, interval=0.002)
        elapsed = time.perf_counter() - start
        agent.signal(signal.SIGTERM)
        agent.wait_exit(20)
    finally:
        agent.kill()
    return elapsed


def time_minimal(arm: Arm, pod: Path, algorithm: str, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run([*arm.prefix(), sys.executable, str(HERE / "minimal_ca_client.py"), str(pod), str(out), ADDRESS,
                    algorithm], check=True)
    return time.perf_counter() - start


def time_to_ready(arm: Arm, implementation: str, pod: Path) -> tuple[float, float]:
    """(seconds from spawn to Envoy's readiness port answering 200, the agent's CPU seconds by then); then the
    agent stopped and its ports free again."""
    environment = sidecar_environment(discovery=ADDRESS, ISTIO_META_DNS_CAPTURE="true")
    start = time.perf_counter()
    agent = start_agent(implementation, pod, environment, prefix=arm.prefix(), log_file=arm.dir / "ready.log")
    try:
        poll(lambda: arm.admin_thread.submit(ready_status).result() == 200, "Envoy ready", 60, agent.output,
             interval=0.005, retry_on=HTTP_NOT_YET)
        elapsed = time.perf_counter() - start
        cpu = cpu_seconds(agent.pid)
        agent.signal(signal.SIGTERM)
        agent.wait_exit(30)
    finally:
        agent.kill()
    poll(lambda: arm.admin_thread.submit(ports_free).result(), "the sidecar ports to be free", 30)
    return elapsed, cpu


def ready_status() -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", 15021, timeout=1)
    try:
        conn.request("GET", "/healthz/ready")
        return conn.getresponse().status
    finally:
        conn.close()


def ports_free() -> bool:
    import socket

    for port in (15000, 15001, 15006, 15020, 15021, 15053, 15090):
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def rotations(arm: Arm, pods: dict[str, Path], seconds: float) -> dict[str, dict[str, float]]:
    """Both agents at once with short-lived certificates: how late each rotation lands, CPU per rotation."""
    agents, outs = {}, {}
    for number, (implementation, pod) in enumerate(pods.items()):
        outs[implementation] = out = arm.dir / f"rotation-{implementation}"
        out.mkdir()
        environment = cert_agent_environment("ECDSA", out, 15030 + number, SECRET_TTL=f"{ROTATION_TTL:g}s",
                                             SECRET_GRACE_PERIOD_RATIO="0.5", SECRET_GRACE_PERIOD_RATIO_JITTER="0")
        agents[implementation] = start_agent(implementation, pod, environment, prefix=arm.prefix(),
                                             log_file=arm.dir / f"rotation-{implementation}.log")
    seen: dict[str, list[tuple[float, bytes]]] = {name: [] for name in agents}
    try:
        for name, out in outs.items():
            poll((out / "cert-chain.pem").exists, f"{name}'s first certificate", 30, agents[name].output)
        cpu_start = {name: cpu_seconds(agent.pid) for name, agent in agents.items()}
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for name, out in outs.items():
                try:
                    chain = (out / "cert-chain.pem").read_bytes()
                except OSError:
                    continue
                if chain and (not seen[name] or seen[name][-1][1] != chain):
                    seen[name].append((time.time(), chain))
            time.sleep(0.005)
        cpu = {name: cpu_seconds(agent.pid) - cpu_start[name] for name, agent in agents.items()}
    finally:
        for agent in agents.values():
            agent.kill()
    out_figures = {}
    for name, certs in seen.items():
        late = []
        for (written, chain), (renewed, _) in itertools.pairwise(certs):
            expiry = x509.load_pem_x509_certificate(chain).not_valid_after_utc.timestamp()
            due = expiry - 0.5 * (expiry - written)
            late.append((renewed - due) * 1000)
        count = len(certs) - 1  # the first one is no rotation
        out_figures[name] = {"rotations": count, "late_ms": statistics.median(late) if late else float("nan"),
                             "cpu_ms": cpu[name] * 1000 / count if count else float("nan")}
    return out_figures


def main() -> None:
    from bench_ca_throughput import measure_ca_throughput

    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("bench_identity needs root and iproute2 (network namespaces)", file=sys.stderr)
        sys.exit(2)
    compile_sources()
    why_not = missing("pilot-agent")
    implementations = [OURS] if why_not else [OURS, GO]
    base = Path(tempfile.mkdtemp(prefix="bench-identity-"))
    arm = Arm("identity", base, base / "state")
    results: dict[str, float | int | str | None] = {}
    try:
        arm.create()
        pod = pod_files(arm.state, arm.dir / "pod", service_account="sleep", pod="sleep-1")
        sidecar_pods = {name: pod_files(arm.state, arm.dir / f"sidecar-{name}", pod="echo-1")
                        for name in implementations}
        arm.start_istiod()
        for algorithm in ("ECDSA", "RSA"):
            times: dict[str, list[float]] = {name: [] for name in ["minimal", *implementations]}
            for i in range(ROUNDS):
                for name in implementations:
                    times[name].append(time_agent(arm, name, pod, algorithm, base / f"{name}-{algorithm}-{i}"))
                times["minimal"].append(time_minimal(arm, pod, algorithm, base / f"m-{algorithm}-{i}"))
            ms = {name: statistics.median(values) * 1000 for name, values in times.items()}
            key = algorithm.lower()
            print(f"time to first cert {algorithm}: pilot-agent {ms[OURS]:.0f} ms, minimal client {ms['minimal']:.0f} "
                  f"ms, ratio {ms[OURS] / ms['minimal']:.2f}"
                  + (f"; upstream's Go agent {ms[GO]:.0f} ms, ours / Go's {ms[OURS] / ms[GO]:.2f}" if GO in ms else ""))
            results[f"time_to_cert_ratio_{key}"] = round(ms[OURS] / ms["minimal"], 3)
            results[f"time_to_cert_ms_{key}"] = round(ms[OURS], 1)
            results[f"minimal_client_ms_{key}"] = round(ms["minimal"], 1)
            if GO in ms:
                results[f"upstream_time_to_cert_ms_{key}"] = round(ms[GO], 1)
                results[f"time_to_cert_{key}_vs_upstream"] = ratio(ms[OURS], ms[GO])
                # The least a Python process does for a certificate, against the Go agent: the floor of the aim.
                results[f"minimal_client_{key}_vs_upstream"] = ratio(ms["minimal"], ms[GO])
        ready: dict[str, list[float]] = {name: [] for name in implementations}
        ready_cpu: dict[str, list[float]] = {name: [] for name in implementations}
        for i in range(READY_ROUNDS + 1):
            for name in implementations if i % 2 == 0 else implementations[::-1]:
                elapsed, cpu = time_to_ready(arm, name, sidecar_pods[name])
                if i > 0:  # round 0 warms the page cache for both
                    ready[name].append(elapsed)
                    ready_cpu[name].append(cpu)
        ready_ms = {name: statistics.median(values) * 1000 for name, values in ready.items()}
        cpu_ms = {name: statistics.median(values) * 1000 for name, values in ready_cpu.items()}
        print("start to Envoy ready (sidecar, DNS on): " + ", ".join(
            f"{name} {ready_ms[name]:.0f} ms (agent CPU by then {cpu_ms[name]:.0f} ms)" for name in ready_ms))
        results["start_to_ready_ms"] = round(ready_ms[OURS], 1)
        results["start_cpu_ms"] = round(cpu_ms[OURS], 1)
        if GO in ready_ms:
            results["upstream_start_to_ready_ms"] = round(ready_ms[GO], 1)
            results["upstream_start_cpu_ms"] = round(cpu_ms[GO], 1)
            results["start_to_ready_vs_upstream"] = ratio(ready_ms[OURS], ready_ms[GO])
            results["start_cpu_vs_upstream"] = ratio(cpu_ms[OURS], cpu_ms[GO])
        rotation_pods = {name: pod_files(arm.state, arm.dir / f"rotation-pod-{name}", service_account="sleep",
                                         pod="sleep-1") for name in implementations}
        rotated = rotations(arm, rotation_pods, ROTATION_SECONDS)
        for name, figures in rotated.items():
            print(f"rotation ({name}, SECRET_TTL {ROTATION_TTL:g} s, {ROTATION_SECONDS:g} s): {figures['rotations']} "
                  f"rotations, new certificate on disk {figures['late_ms']:.0f} ms after due (median), "
                  f"{figures['cpu_ms']:.0f} ms CPU per rotation")
        results["rotation_late_ms"] = round(rotated[OURS]["late_ms"], 1)
        results["rotation_cpu_ms"] = round(rotated[OURS]["cpu_ms"], 1)
        if GO in rotated:
            results["upstream_rotation_late_ms"] = round(rotated[GO]["late_ms"], 1)
            results["upstream_rotation_cpu_ms"] = round(rotated[GO]["cpu_ms"], 1)
            results["rotation_late_ms_vs_upstream"] = ratio(rotated[OURS]["late_ms"], rotated[GO]["late_ms"])
            results["rotation_cpu_vs_upstream"] = ratio(rotated[OURS]["cpu_ms"], rotated[GO]["cpu_ms"])
    finally:
        arm.stop()
        shutil.rmtree(base, ignore_errors=True)
    if why_not:
        say_missing("bench_identity", why_not)
        results["upstream"] = why_not
    for concurrency in (1, 50):
        rate = measure_ca_throughput(concurrency=concurrency, algorithm="ECDSA", seconds=3.0)
        print(f"istiod-local ECDSA CSRs/s with {concurrency} concurrent clients: {rate:.0f}")
        results[f"ca_csr_per_s_ecdsa_{concurrency}"] = round(rate, 1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
