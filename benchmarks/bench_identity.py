"""Identity benchmark (issue 2).

(a) Time from `pilot-agent proxy` start to its first certificate on disk, as a
    ratio against `minimal_ca_client.py` (a fresh Python process that only makes
    a key and CSR, calls istiod-local and writes the files), for ECDSA and RSA.
    Both run against the same istiod-local in the same run, interleaved, and
    the medians are compared, so machine noise hits both sides alike. An RSA
    key takes 40-200 ms to generate (the prime search varies), on both sides:
    15 rounds by default (BENCH_ROUNDS) so that the medians settle.

    Where the agent's time goes (timestamps from spawn, 2 cores, RSA, before
    the first key was made ahead): interpreter ~20 ms, the agent's imports and
    options to `run_agent` ~230-280 ms, identity stage ~15-30 ms, then the key
    (40-100 ms) and CSR on a thread, the CA call ~10-15 ms, and the check of
    the issued certificate against its key (~45 ms when it parsed the RSA PEM
    back) before the files. Now the key is made on a thread from the CLI's
    start, beside the imports (`security/key_ahead.py`), and checked as the
    object it is; what remains over the minimal client is imports.
(b) istiod-local signing throughput with 1 and 50 concurrent clients (ECDSA).

Prints each figure on its own line and, last, one JSON object.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
from launchers import IstiodLocal, PilotAgent, agent_environment
from support import compile_sources, free_port, poll

HERE = Path(__file__).resolve().parent
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "15"))
sys.path.insert(0, str(HERE))


def time_agent(pod: Path, address: str, algorithm: str, out: Path) -> float:
    environment = agent_environment(
        pod="sleep-1", service_account="sleep", discovery=address, DISABLE_ENVOY="true", OUTPUT_CERTS=str(out),
        SECRET_TTL="1h", ECC_SIGNATURE_ALGORITHM="ECDSA" if algorithm == "ECDSA" else "",
        # A private status port, so a test or another agent on this host cannot make the run fail.
        PROXY_CONFIG=json.dumps({"statusPort": free_port()}))
    chain = out / "cert-chain.pem"
    start = time.perf_counter()
    agent = PilotAgent(pod, environment).start()
    try:
        poll(lambda: chain.exists() and (out / "root-cert.pem").exists(), "the certificate files", 60,
             agent.output, interval=0.002)
        elapsed = time.perf_counter() - start
        agent.signal(signal.SIGTERM)
        agent.wait_exit(20)
    finally:
        agent.kill()
    return elapsed


def time_minimal(pod: Path, address: str, algorithm: str, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, str(HERE / "minimal_ca_client.py"), str(pod), str(out), address, algorithm],
                   check=True)
    return time.perf_counter() - start


def main() -> None:
    from bench_ca_throughput import measure_ca_throughput

    compile_sources()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        with IstiodLocal(base / "state") as server:
            pod = server.pod_files(base / "pod", service_account="sleep", pod="sleep-1")
            address = server.secure_address
            results: dict[str, float] = {}
            for algorithm in ("ECDSA", "RSA"):
                agent_times: list[float] = []
                minimal_times: list[float] = []
                for i in range(ROUNDS):
                    agent_times.append(time_agent(pod, address, algorithm, base / f"a-{algorithm}-{i}"))
                    minimal_times.append(time_minimal(pod, address, algorithm, base / f"m-{algorithm}-{i}"))
                agent_ms = statistics.median(agent_times) * 1000
                minimal_ms = statistics.median(minimal_times) * 1000
                ratio = agent_ms / minimal_ms
                print(f"time to first cert {algorithm}: pilot-agent {agent_ms:.0f} ms, "
                      f"minimal client {minimal_ms:.0f} ms, ratio {ratio:.2f}")
                results[f"time_to_cert_ratio_{algorithm.lower()}"] = round(ratio, 3)
                results[f"time_to_cert_ms_{algorithm.lower()}"] = round(agent_ms, 1)
                results[f"minimal_client_ms_{algorithm.lower()}"] = round(minimal_ms, 1)
    for concurrency in (1, 50):
        rate = measure_ca_throughput(concurrency=concurrency, algorithm="ECDSA", seconds=3.0)
        print(f"istiod-local ECDSA CSRs/s with {concurrency} concurrent clients: {rate:.0f}")
        results[f"ca_csr_per_s_ecdsa_{concurrency}"] = round(rate, 1)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
