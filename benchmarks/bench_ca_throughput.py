"""istiod-local signing throughput: CSRs signed per second over TLS, server pinned to one core.

`measure_ca_throughput(concurrency, algorithm, seconds)` starts a fresh
`istiod-local serve` (logging at warning level, pinned to one CPU), then drives
it from this process (pinned to the other CPUs when there are any) with
`concurrency` gRPC calls in flight on one TLS channel, each a real
CreateCertificate with a valid token and a CSR of the given key algorithm.
CSRs are made before the clock starts (a small pool, reused: the server still
parses, checks and signs every one), so only the CA's work and gRPC are timed.

Run directly it prints the figures and, last, one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers shared with the tests
from launchers import IstiodLocal
from support import free_port

SLEEP_ID = "spiffe://cluster.local/ns/default/sa/sleep"
WARMUP_S = 0.5
CSR_POOL = {"ECDSA": 64, "RSA": 8}


def _cpus() -> tuple[set[int], set[int]]:
    """(server CPUs, client CPUs): one core for the server, the rest for the client (shared if only one)."""
    available = sorted(os.sched_getaffinity(0))
    server = {available[0]}
    client = set(available[1:]) or server
    return server, client


def _server(state: Path, plain: int, secure: int, cpus: set[int]) -> IstiodLocal:
    """istiod-local at warning level (no log line per CSR), pinned before exec so that every thread it ever makes
    stays on its core."""
    launcher = "import os, sys; os.sched_setaffinity(0, set(map(int, sys.argv[1].split(',')))); " \
               "os.execv(sys.argv[2], sys.argv[2:])"
    return IstiodLocal(state, grpc_addr=f"127.0.0.1:{plain}", secure_addr=f"127.0.0.1:{secure}", quiet=True,
                       prefix=[sys.executable, "-c", launcher, ",".join(map(str, sorted(cpus)))])


async def _drive(address: str, root_pem: bytes, token: str, csrs: list[str], concurrency: int,
                 seconds: float) -> float:
    import grpc

    from istio_agent.protos import istioca_pb2, istioca_pb2_grpc

    creds = grpc.ssl_channel_credentials(root_certificates=root_pem)
    options = [("grpc.ssl_target_name_override", "istiod.istio-system.svc")]
    async with grpc.aio.secure_channel(address, creds, options=options) as channel:
        await asyncio.wait_for(channel.channel_ready(), timeout=30)
        stub = istioca_pb2_grpc.IstioCertificateServiceStub(channel)
        metadata = (("authorization", f"Bearer {token}"), ("clusterid", "Kubernetes"))
        requests = [istioca_pb2.IstioCertificateRequest(csr=c, validity_duration=3600) for c in csrs]
        counting = False
        done = 0
        stop_at = 0.0

        async def worker(index: int) -> None:
            nonlocal done
            i = index
            while True:
                response = await stub.CreateCertificate(requests[i % len(requests)], metadata=metadata, timeout=30)
                if len(response.cert_chain) != 2:
                    raise RuntimeError(f"unexpected chain of {len(response.cert_chain)} certificates")
                i += 1
                if counting:
                    done += 1
                if stop_at and time.perf_counter() >= stop_at:
                    return

        tasks = [asyncio.create_task(worker(i)) for i in range(concurrency)]
        await asyncio.sleep(WARMUP_S)
        counting, start = True, time.perf_counter()
        stop_at = start + seconds
        await asyncio.sleep(seconds)
        counting, elapsed = False, time.perf_counter() - start
        await asyncio.gather(*tasks)
        return done / elapsed


def measure_ca_throughput(concurrency: int, algorithm: str, seconds: float) -> float:
    """CSRs per second istiod-local (on one core, over TLS) signs for `concurrency` callers in flight."""
    from istio_agent.pki.certs import build_csr
    from istio_agent.pki.keys import generate_key
    from istiod_local.controlplane.podfiles import pod_token
    from istiod_local.controlplane.state import load_or_create_state

    if algorithm not in CSR_POOL:
        raise ValueError(f"algorithm must be ECDSA or RSA, not {algorithm!r}")
    csrs = [build_csr(generate_key(algorithm), [SLEEP_ID]).decode() for _ in range(CSR_POOL[algorithm])]  # type: ignore[arg-type]
    server_cpus, client_cpus = _cpus()
    saved_affinity = os.sched_getaffinity(0)
    with tempfile.TemporaryDirectory() as tmp:
        state_dir = Path(tmp) / "state"
        state = load_or_create_state(state_dir, "cluster.local", time.time())
        token = pod_token(state, "default", "sleep", "sleep-1", 3600, time.time())
        plain, secure = free_port(), free_port()
        with _server(state_dir, plain, secure, server_cpus):
            try:
                os.sched_setaffinity(0, client_cpus)
                return asyncio.run(_drive(f"127.0.0.1:{secure}", state.root_cert_pem.encode(), token, csrs,
                                          concurrency, seconds))
            finally:
                os.sched_setaffinity(0, saved_affinity)


def main() -> None:
    seconds = float(os.environ.get("BENCH_SECONDS", "3"))
    results: dict[str, float] = {}
    for algorithm, concurrency in (("ECDSA", 1), ("ECDSA", 50), ("RSA", 50)):
        rate = measure_ca_throughput(concurrency, algorithm, seconds)
        print(f"istiod-local {algorithm} CSRs/s with {concurrency} concurrent clients (server on one core, TLS): "
              f"{rate:.0f}")
        results[f"ca_csr_per_s_{algorithm.lower()}_{concurrency}"] = round(rate, 1)
    print(f"target: >= 500 ECDSA CSRs/s on one core; "
          f"{'met' if results['ca_csr_per_s_ecdsa_50'] >= 500 else 'NOT met'}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
